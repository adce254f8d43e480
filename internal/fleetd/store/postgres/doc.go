// Package postgres is the store of fleetd for several replicas: a
// store.Store in one PostgreSQL database, through github.com/jackc/pgx/v5,
// that every fleetd replica opens. It passes the same conformance suite
// (package storetest) as the embedded SQLite store.
//
// The schema is versioned like SQLite's: Open applies the migrations this
// binary knows and the database has not had yet, under a transaction-level
// advisory lock, so replicas that start together apply each migration
// once; a database whose schema is newer than the binary is refused.
//
// Writes to one node (a join, a renewal, a revocation, a deletion) take
// the node's row lock or a transaction-level advisory lock on its id, so
// they happen one after the other whichever replica makes them; a token
// is spent by one conditional UPDATE, so of many concurrent joins with one
// token exactly one wins.
//
// A revocation (RevokeNode, DeleteNode) also appends a row to the
// revocations table and sends a NOTIFY on channel nodetrust_revocations in
// the same transaction, so every replica hears of it when it commits;
// WatchRevocations delivers them, and after a lost connection reads the
// rows it missed before it listens again (the catch-up read), so a
// notification lost during a database blip is not a lost revocation.
//
// A failure to reach the database (refused or broken connections, a server
// shutting down) wraps store.ErrUnavailable: the caller answers UNAVAILABLE
// and tries again later; the pool reconnects by itself.
//
// Times are stored as timestamptz (microsecond precision) and read back in
// UTC; the zero time.Time is stored as NULL.
//
// Imported by fleetd's wiring, and by the tests.
package postgres
