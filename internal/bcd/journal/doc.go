// Package journal keeps the node's journal: a local, append-only record of
// what happened to the node's identity (joined, renewed, a renewal that
// failed, revoked, reset, started), in journal.db in the data directory.
//
// The journal is an SQLite database (WAL, synchronous=FULL, mode 0600) with
// a random 128-bit journal id, created with it. Entries are only ever added:
// the package has no way to change or remove one, and the database refuses
// UPDATE and DELETE on its tables.
//
// The identity outlives a lost journal. Open moves a corrupt journal aside as
// journal.db.corrupt-<unix time> and starts a new one with a new journal id,
// and a wiped journal simply starts over; neither touches identity.json,
// node.key or any other file of the data directory. ReadLast reads a journal
// without creating, changing or moving any file, for bcd status.
//
// The package does not log: Open reports a recovery through Recovered and
// Recovery, for the caller to log.
package journal
