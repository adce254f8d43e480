package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// DB is a store.Store in a PostgreSQL database. It is safe for concurrent
// use, and several processes may open the same database.
type DB struct {
	pool *pgxpool.Pool
	// dsn is the connection string, kept for the revocation listener's
	// own connection.
	cfg *pgxpool.Config

	// onSession receives the session messages the revocation listener
	// hears (sessions.go).
	onSession atomic.Pointer[func(store.SessionMessage)]
}

var _ store.Store = (*DB)(nil)

// Options tune Open.
type Options struct {
	// Password, when not empty, is the role's password (read from a file by
	// the caller). Without it pgx takes PGPASSWORD or PGPASSFILE from the
	// environment, as libpq does.
	Password string
	// MaxConns bounds the pool (default 16 unless the URL sets
	// pool_max_conns).
	MaxConns int32
}

// Open connects to the database the URL names (postgres://…, as libpq
// takes it), applies pending schema migrations under an advisory lock and
// returns the store. The caller must Close it.
func Open(ctx context.Context, dsn string, o Options) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", Redact(dsn), err)
	}
	if o.Password != "" {
		cfg.ConnConfig.Password = o.Password
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = 16
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		// A database host that does not answer must not hold a join for
		// the whole of its deadline.
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "fleetd"
	// Broken connections are found by the next query; check connections
	// that sat idle before handing them out.
	cfg.HealthCheckPeriod = 10 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", Redact(dsn), err)
	}
	if err := migrate(ctx, pool, migrations); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open store %s: %w", Redact(dsn), wrap(err))
	}
	return &DB{pool: pool, cfg: cfg}, nil
}

// Close releases the store's connections. Calls in flight may fail.
func (d *DB) Close() error {
	d.pool.Close()
	return nil
}

// Redact returns the URL with any password replaced, for logs and errors.
func Redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(a malformed URL)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// HasPassword reports whether the URL carries a password.
func HasPassword(dsn string) bool {
	u, err := url.Parse(dsn)
	if err != nil {
		return false
	}
	_, ok := u.User.Password()
	return ok || u.Query().Has("password")
}

// wrap marks the errors that mean the database could not be reached with
// store.ErrUnavailable, keeping the cause.
func wrap(err error) error {
	if err == nil || !unreachable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}

// unreachable reports whether err is a failure to reach or keep the
// database rather than an answer from it.
func unreachable(err error) bool {
	if errors.Is(err, store.ErrUnavailable) {
		return false // already marked
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"): // connection exception
			return true
		case pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03": // admin shutdown, crash shutdown, cannot connect now
			return true
		case pe.Code == "53300": // too many connections
			return true
		}
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false // the caller gave up
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	switch {
	case errors.As(err, &ce), errors.As(err, &ne), pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	case errors.Is(err, context.DeadlineExceeded):
		return true
	}
	// A connection closed under a statement ("conn closed", unexpected
	// EOF) is not a PgError either.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "unexpected EOF") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe") ||
		strings.Contains(msg, "closed pool")
}

// tx runs fn in a transaction and commits it if fn returns nil. A
// serialization failure or deadlock is retried a few times.
func (d *DB) tx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		err = d.txOnce(ctx, fn)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "40001" && pe.Code != "40P01") {
			break
		}
	}
	return wrap(err)
}

func (d *DB) txOnce(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) && !unreachable(err) {
			return errors.Join(err, fmt.Errorf("rollback: %w", rerr))
		}
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// mustChange returns conflict unless tag changed a row.
func mustChange(tag pgconn.CommandTag, conflict error) error {
	if tag.RowsAffected() == 0 {
		return conflict
	}
	return nil
}

// lockNode takes the transaction-level advisory lock of a node id: the
// writes of one node's join, revocation and deletion run one after the
// other, on every replica.
func lockNode(ctx context.Context, tx pgx.Tx, id string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('nodetrust.node:' || $1, 0))`, id); err != nil {
		return fmt.Errorf("lock node %q: %w", id, err)
	}
	return nil
}

// ts is a time as a column value: NULL for the zero time.
func ts(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// fromTS is the inverse of ts.
func fromTS(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// gen is an identity generation as a bigint.
func gen(g uint64) (int64, error) {
	if g > 1<<63-1 {
		return 0, fmt.Errorf("generation %d is too large", g)
	}
	return int64(g), nil
}

// list is a claim list as a text[]: never NULL.
func list(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

// fromList is the inverse of list: empty is nil.
func fromList(l []string) []string {
	if len(l) == 0 {
		return nil
	}
	return l
}
