// Package storetest is the conformance suite of store.Store: every
// implementation (the embedded SQLite store, the PostgreSQL store) runs
// Run from its own tests and must pass it unchanged.
//
// The suite checks the contracts written on store.Store and, where the
// interface leaves a choice, pins one so that the implementations agree:
//
//   - Times read back equal (time.Time.Equal) to the times written; the
//     suite uses microsecond precision, the finest PostgreSQL keeps. The
//     zero time reads back as the zero time. Empty and nil claim lists are
//     equivalent.
//   - A token that expires exactly at Join.Now is expired.
//   - CreateToken also refuses a token whose Hash exists, with ErrConflict.
//   - CompleteJoin refuses, writing nothing, a certificate that names
//     another node or generation than Join.Node; ErrConflict when the
//     certificate's serial exists. A reclaim of a node that does not exist
//     writes it.
//   - NodesByClaims returns each matching node once, ordered by id; empty
//     strings, as the product UUID or among the serials, match nothing.
//   - RecordRenewal of a node that does not exist is ErrConflict.
//   - RevokeNode and DeleteNode of a node that does not exist are
//     ErrNotFound; the revoked serials may come in any order.
//   - CountCerts counts revoked certificates too.
//   - ListAudit orders by event Time, newest first, and events of the same
//     Time latest appended first; a limit below 1 is an error.
package storetest
