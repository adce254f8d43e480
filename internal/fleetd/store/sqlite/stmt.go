package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// The store's SQL statements are registered once, at package
// initialization, by the files that use them. Open prepares each one on its
// pool (database/sql then keeps one prepared copy per connection of the
// pool), so that SQLite parses and plans a statement once per connection
// rather than on every call; Close closes them. Inside a write transaction
// a writer statement is bound to the transaction with Tx.StmtContext, once
// per transaction, which reuses the copy prepared on the writer connection.
//
// A DB made by open, the tests' way to open a file at an older or a made-up
// schema, has no prepared statements: on such a schema some of them would
// not prepare. Its methods run the same SQL unprepared.

// readQuery is a statement of the reader pool.
type readQuery int

// writeQuery is a statement run in a write transaction.
type writeQuery int

var readSQL, writeSQL []string

// newReadQuery registers a reader statement; only package-level variables
// call it.
func newReadQuery(q string) readQuery {
	readSQL = append(readSQL, q)
	return readQuery(len(readSQL) - 1)
}

// newWriteQuery registers a writer statement; only package-level variables
// call it.
func newWriteQuery(q string) writeQuery {
	writeSQL = append(writeSQL, q)
	return writeQuery(len(writeSQL) - 1)
}

// prepare prepares every registered statement on its pool. On an error it
// closes what it prepared.
func (d *DB) prepare(ctx context.Context) error {
	reads, err := prepareAll(ctx, d.r, readSQL)
	if err != nil {
		return err
	}
	writes, err := prepareAll(ctx, d.w, writeSQL)
	if err != nil {
		return errors.Join(err, closeAll(reads))
	}
	d.reads, d.writes = reads, writes
	return nil
}

func prepareAll(ctx context.Context, db *sql.DB, qs []string) ([]*sql.Stmt, error) {
	stmts := make([]*sql.Stmt, len(qs))
	for i, q := range qs {
		s, err := db.PrepareContext(ctx, q)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("prepare %q: %w", q, err), closeAll(stmts[:i]))
		}
		stmts[i] = s
	}
	return stmts, nil
}

func closeAll(stmts []*sql.Stmt) error {
	var errs []error
	for _, s := range stmts {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

// queryRow runs a reader statement that returns at most one row.
func (d *DB) queryRow(ctx context.Context, q readQuery, vals ...any) *sql.Row {
	if d.reads != nil {
		return d.reads[q].QueryRowContext(ctx, vals...)
	}
	return d.r.QueryRowContext(ctx, readSQL[q], vals...)
}

// query runs a reader statement; the caller closes the rows.
func (d *DB) query(ctx context.Context, q readQuery, vals ...any) (*sql.Rows, error) {
	if d.reads != nil {
		return d.reads[q].QueryContext(ctx, vals...)
	}
	return d.r.QueryContext(ctx, readSQL[q], vals...)
}

// queryAll runs a reader statement and scans every row with scan.
func queryAll[T any](ctx context.Context, d *DB, scan func(scanner) (T, error), q readQuery, vals ...any) ([]T, error) {
	rows, err := d.query(ctx, q, vals...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// wtx is a write transaction and the statements bound to it.
type wtx struct {
	ctx   context.Context
	tx    *sql.Tx
	d     *DB
	bound []*sql.Stmt // by writeQuery, bound on first use
}

// stmt returns q bound to the transaction, or nil if the DB has no
// prepared statements.
func (t *wtx) stmt(q writeQuery) *sql.Stmt {
	if t.d.writes == nil {
		return nil
	}
	if t.bound == nil {
		t.bound = make([]*sql.Stmt, len(writeSQL))
	}
	if t.bound[q] == nil {
		t.bound[q] = t.tx.StmtContext(t.ctx, t.d.writes[q])
	}
	return t.bound[q]
}

func (t *wtx) exec(q writeQuery, vals ...any) (sql.Result, error) {
	if s := t.stmt(q); s != nil {
		return s.ExecContext(t.ctx, vals...)
	}
	return t.tx.ExecContext(t.ctx, writeSQL[q], vals...)
}

func (t *wtx) queryRow(q writeQuery, vals ...any) *sql.Row {
	if s := t.stmt(q); s != nil {
		return s.QueryRowContext(t.ctx, vals...)
	}
	return t.tx.QueryRowContext(t.ctx, writeSQL[q], vals...)
}

func (t *wtx) query(q writeQuery, vals ...any) (*sql.Rows, error) {
	if s := t.stmt(q); s != nil {
		return s.QueryContext(t.ctx, vals...)
	}
	return t.tx.QueryContext(t.ctx, writeSQL[q], vals...)
}

// write runs fn in a write transaction (BEGIN IMMEDIATE on the single
// writer connection) and commits it if fn returns nil.
func (d *DB) write(ctx context.Context, fn func(t *wtx) error) error {
	tx, err := d.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(&wtx{ctx: ctx, tx: tx, d: d}); err != nil {
		if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			return errors.Join(err, fmt.Errorf("rollback: %w", rerr))
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
