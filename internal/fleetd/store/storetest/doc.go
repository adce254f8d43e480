// Package storetest is the conformance suite of store.Store: every
// implementation (the embedded SQLite store, the PostgreSQL store) runs Run from its own
// tests and must pass it unchanged.
//
// The suite checks the contracts written on store.Store and, where the
// interface leaves a choice, pins one so that the implementations agree:
//
//   - Times read back equal (time.Time.Equal) to the times written; the
//     suite uses microsecond precision, the finest PostgreSQL keeps, so
//     that a PostgreSQL store can pass it too. The
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
//   - DeleteNode's tombstone bars any join of the id, a reclaim included,
//     at or below the generation it revoked at, with ErrConflict and
//     writing nothing; NextGeneration counts a live node of the id that
//     joined after the deletion as well as the tombstone.
//   - CountCerts counts revoked certificates too; so does RenewalTimes,
//     which leaves out certificates of any kind but "renew" (a reclaim's
//     join certificate included). A zero since means from the beginning.
//   - A pending join expires, as a token does, when now reaches its
//     ExpiresAt. GetPending returns it whether or not it has expired;
//     ListPending leaves expired ones out and lists approved ones that no
//     join has completed yet, ordered by CreatedAt. Empty and nil hashes
//     are equivalent.
//   - ApprovePending returns the pending joins it approved ordered by
//     CreatedAt. It is ErrNotFound when every pending join of the node is
//     expired or approved already, and it never rewrites an approval.
//   - CompleteJoin with a PendingID is ErrConflict, writing nothing and
//     leaving the token unspent, when the pending join is unknown (an
//     already completed one included) or unapproved, or when it was made
//     for another node id or another token hash than the join's (no token
//     included). It does not check the pending join's expiry; the caller
//     does.
//   - A tpm challenge round expires, as a token does, when now reaches its
//     NotAfter; PutChallenge removes expired rounds before it counts the
//     open ones against max; TakeChallenge returns a round whether or not
//     it has expired, if no later PutChallenge removed it.
//   - Intake sessions expire in the same way at ExpiresAt, bounded by
//     PutIntakeSession's max; GetIntakeSession returns one whether or not
//     it has expired (the caller refuses a stale one).
//   - ListAudit orders by event Time, newest first, and events of the same
//     Time latest appended first; a limit below 1 is an error.
//   - The audit event given to CompleteJoin (Join.Audit), RecordRenewal,
//     RevokeNode, DeleteNode, CreateAdmin, RevokeAdmin, ApplyInventory or
//     TransitionNode is appended if and only if the call succeeds; a nil
//     event appends nothing.
//   - A revocation of a quarantined or retired node keeps its state and
//     writes no history; one of an active node writes active → revoked
//     with the audit event's actor. Only an active node renews.
//   - A declaration's version is 1 after its first write. ListChanges and
//     NodeHistory order as ListAudit does (changes newest first, history
//     oldest first, by order of appending). A transition that creates the
//     node of a planned device records planned as the state it came from.
//   - RecordRenewalLimited counts the node's renewals issued at or after
//     c.IssuedAt - Window (one exactly at that instant still counts); its
//     RetryAt is the Window after the oldest of the Max latest counted
//     renewals; a node that changed is ErrConflict before any count, and a
//     limit below 1, a window not positive or a zero IssuedAt is an error.
//   - NodeByEKPin prefers a node that is not retired, then the lowest id.
//   - A repeated claim keeps its FirstSeen and counts up; the bound evicts
//     the claim with the oldest LastSeen.
//   - A config release's claim lapses exactly at its ClaimedUntil and a
//     release expires exactly at its ExpiresAt; a new render of a UUID
//     drops the earlier render's claim, burn and activation with it.
package storetest
