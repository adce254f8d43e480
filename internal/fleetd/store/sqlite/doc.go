// Package sqlite is the embedded store of fleetd: a store.Store kept in one
// SQLite file through the pure Go driver modernc.org/sqlite.
//
// The file is opened in WAL mode with synchronous=FULL, so a transaction
// that has returned is on disk and survives a crash or power loss. All
// writes go through a single connection that begins its transactions with
// BEGIN IMMEDIATE, so concurrent writers in the process queue for that
// connection instead of failing with SQLITE_BUSY; reads use a separate pool
// of read-only connections and are not blocked by a writer. A second
// process writing the same file waits up to the busy timeout.
//
// Open prepares the store's statements once on each pool (and database/sql
// once on each of its connections); Close closes them. Concurrent
// CompleteJoin and RecordRenewal calls are committed together (group
// commit): the calls that arrive while such a transaction runs share the
// next one, joins and renewals mixed, each call in its own savepoint, so
// that many joins and renewals cost one fdatasync while each caller still
// gets its own result, after the COMMIT. A lone call runs at once.
//
// The schema is versioned: Open applies the migrations this binary knows
// and have not yet been applied, each in its own transaction, and refuses a
// file whose schema is newer than the binary. Version 2 added the
// pending_joins table of joins waiting for approval; CompleteJoin removes
// the row of the pending join it completes.
//
// Times are stored as Unix nanoseconds in UTC and read back in UTC; the
// zero time.Time is stored as NULL and read back as the zero time. Times
// before 1678 or after 2262 cannot be stored and are refused.
package sqlite
