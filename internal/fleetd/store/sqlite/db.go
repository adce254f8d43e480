package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	// The pure Go SQLite driver, registered as "sqlite".
	_ "modernc.org/sqlite"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// busyTimeout is how long a statement waits for a lock held by another
// process (another fleetd command on the same file) before failing.
const busyTimeout = 10 * time.Second

// DB is a store.Store in one SQLite file. It is safe for concurrent use.
type DB struct {
	// w is the only connection that writes: MaxOpenConns(1) serializes the
	// process's write transactions, which begin with BEGIN IMMEDIATE.
	w *sql.DB
	// r is a pool of read-only connections; in WAL mode they read the
	// last committed state without waiting for the writer.
	r *sql.DB
	// reads and writes are the registered statements prepared on r and w,
	// indexed by readQuery and writeQuery; nil in a DB made by open alone.
	reads, writes []*sql.Stmt
	// queue groups concurrent CompleteJoin and RecordRenewal calls into
	// shared transactions (batch.go).
	queue commitQueue
	// beforeCommit, when set (by tests only), runs in each batched
	// transaction (of CompleteJoin and RecordRenewal calls) just before its
	// COMMIT, with the number of calls in the transaction's batch.
	beforeCommit func(tx *sql.Tx, calls int)
}

var _ store.Store = (*DB)(nil)

// Open opens the store in the SQLite file at path, creating the file with
// mode 0600 when it does not exist, and applies pending schema migrations.
// The directory must exist. Open refuses a file whose schema version is
// newer than this binary knows. The caller must Close the DB.
func Open(ctx context.Context, path string) (*DB, error) {
	db, err := open(ctx, path, migrations)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if err := db.prepare(ctx); err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, errors.Join(err, db.Close()))
	}
	return db, nil
}

// open is Open with the migrations to apply as a parameter, for tests. It
// does not prepare the store's statements (see stmt.go): the DB it returns
// runs them unprepared.
func open(ctx context.Context, path string, migrations []string) (*DB, error) {
	if path == "" {
		return nil, errors.New("empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	// SQLite would create the file with mode 0644; create it first so that
	// it, and the -wal and -shm files SQLite gives the same mode, are 0600.
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}

	w, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_txlock":       {"immediate"},
		"_journal_mode": {"WAL"},
		"_synchronous":  {"FULL"},
	}))
	if err != nil {
		return nil, err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	if err := checkPragmas(ctx, w); err != nil {
		return nil, errors.Join(err, w.Close())
	}
	if err := migrate(ctx, w, migrations); err != nil {
		return nil, errors.Join(err, w.Close())
	}

	r, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_query_only": {"1"},
	}))
	if err != nil {
		return nil, errors.Join(err, w.Close())
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	if err := r.PingContext(ctx); err != nil {
		return nil, errors.Join(err, r.Close(), w.Close())
	}
	return &DB{w: w, r: r}, nil
}

// dsn returns a driver name for the file at the absolute path abs with the
// settings every connection needs plus extra. It is a file: URI so that any
// byte of the path (a '?' included) reaches SQLite as it is.
func dsn(abs string, extra url.Values) string {
	q := url.Values{
		"_busy_timeout": {fmt.Sprint(busyTimeout.Milliseconds())},
		"_foreign_keys": {"1"},
	}
	for k, v := range extra {
		q[k] = v
	}
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: q.Encode()}
	return u.String()
}

// checkPragmas verifies the settings SQLite may decline silently: an
// unsupported journal mode leaves the old one in place without an error.
func checkPragmas(ctx context.Context, db *sql.DB) error {
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("read journal mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal mode is %q, want wal (is the file on a file system without shared memory?)", mode)
	}
	var sync int
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
		return fmt.Errorf("read synchronous: %w", err)
	}
	if sync != 2 { // FULL
		return fmt.Errorf("synchronous is %d, want 2 (FULL)", sync)
	}
	return nil
}

// Close releases the store's prepared statements and connections. Calls in
// flight may fail.
func (d *DB) Close() error {
	stmts := errors.Join(closeAll(d.reads), closeAll(d.writes))
	// Closing the writer last lets the last connection checkpoint the WAL.
	if err := errors.Join(stmts, d.r.Close(), d.w.Close()); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}
