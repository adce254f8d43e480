package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var pendingCases = []testCase{
	{"a created pending join reads back by its id", func(t *testing.T, s store.Store) {
		p := newPending("p1", "node-1", "tok1", at(0))
		mustCreatePending(t, s, p)
		wantEqual(t, "GetPending", normPending, mustGetPending(t, s, "p1"), p)

		approved := newPending("p2", "node-2", "tok2", at(time.Minute))
		approved.ApprovedAt, approved.ApprovedBy = at(2*time.Minute), "owner@example.org"
		approved.Claims = store.Claims{}
		mustCreatePending(t, s, approved)
		wantEqual(t, "GetPending(approved, without claims)", normPending, mustGetPending(t, s, "p2"), approved)
	}},
	{"creating a pending join whose id exists is a conflict", func(t *testing.T, s store.Store) {
		first := newPending("p1", "node-1", "tok1", at(0))
		mustCreatePending(t, s, first)
		dup := newPending("p1", "node-2", "tok2", at(time.Minute))
		wantErr(t, "CreatePending(same id)", s.CreatePending(t.Context(), dup), store.ErrConflict)
		wantEqual(t, "first pending join", normPending, mustGetPending(t, s, "p1"), first)
	}},
	{"an unknown pending join is not found", func(t *testing.T, s store.Store) {
		mustCreatePending(t, s, newPending("p1", "node-1", "tok1", at(0)))
		_, err := s.GetPending(t.Context(), "p2")
		wantErr(t, "GetPending(unknown)", err, store.ErrNotFound)
	}},
	{"pending joins list oldest first without the expired ones", func(t *testing.T, s store.Store) {
		ps, err := s.ListPending(t.Context(), at(0))
		if err != nil || len(ps) != 0 {
			t.Fatalf("ListPending on an empty store = %v, %v; want none", ps, err)
		}
		now := at(time.Hour)
		expired := newPending("p-expired", "node-x", "tok-x", at(-2*time.Hour)) // expires at(-time.Hour)
		atNow := newPending("p-at-now", "node-y", "tok-y", at(0))               // expires exactly now
		approved := newPending("p-approved", "node-c", "tok-c", at(30*time.Minute))
		approved.ApprovedAt, approved.ApprovedBy = at(40*time.Minute), "owner@example.org"
		// Created out of order, so that insertion order is not the answer.
		for _, p := range []store.Pending{
			newPending("p-b", "node-b", "tok-b", at(20*time.Minute)),
			expired,
			newPending("p-d", "node-d", "tok-d", at(50*time.Minute)),
			atNow,
			newPending("p-a", "node-a", "tok-a", at(10*time.Minute)),
			approved,
		} {
			mustCreatePending(t, s, p)
		}
		ps, err = s.ListPending(t.Context(), now)
		if err != nil {
			t.Fatalf("ListPending: %v", err)
		}
		wantPendingIDs(t, "ListPending", ps, "p-a", "p-b", "p-approved", "p-d")
		if len(ps) == 4 {
			wantEqual(t, "listed approved pending join", normPending, ps[2], approved)
		}
		// Expired pending joins are not listed, but still read back.
		wantEqual(t, "GetPending(expired)", normPending, mustGetPending(t, s, "p-at-now"), atNow)

		ps, err = s.ListPending(t.Context(), now.Add(-time.Microsecond))
		if err != nil {
			t.Fatalf("ListPending: %v", err)
		}
		wantPendingIDs(t, "ListPending a moment earlier", ps, "p-at-now", "p-a", "p-b", "p-approved", "p-d")
	}},
	{"approving a node's pending joins marks them approved", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		later := newPending("p2", "node-1", "tok2", at(10*time.Minute))
		earlier := newPending("p1", "node-1", "tok1", at(5*time.Minute))
		other := newPending("p3", "node-2", "tok3", at(0))
		for _, p := range []store.Pending{later, earlier, other} {
			mustCreatePending(t, s, p)
		}
		ps, err := s.ApprovePending(ctx, "node-1", "owner@example.org", at(20*time.Minute))
		if err != nil {
			t.Fatalf("ApprovePending: %v", err)
		}
		for _, p := range []*store.Pending{&earlier, &later} {
			p.ApprovedAt, p.ApprovedBy = at(20*time.Minute), "owner@example.org"
		}
		wantPendingIDs(t, "ApprovePending", ps, "p1", "p2")
		if len(ps) == 2 {
			wantEqual(t, "approved p1", normPending, ps[0], earlier)
			wantEqual(t, "approved p2", normPending, ps[1], later)
		}
		wantEqual(t, "GetPending(p1)", normPending, mustGetPending(t, s, "p1"), earlier)
		wantEqual(t, "GetPending(p2)", normPending, mustGetPending(t, s, "p2"), later)
		wantEqual(t, "another node's pending join", normPending, mustGetPending(t, s, "p3"), other)

		// Approved pending joins stay listed until they are completed or
		// expire.
		listed, err := s.ListPending(ctx, at(30*time.Minute))
		if err != nil {
			t.Fatalf("ListPending: %v", err)
		}
		wantPendingIDs(t, "ListPending", listed, "p3", "p1", "p2")

		// A second approval finds nothing left to approve and does not
		// rewrite the first.
		_, err = s.ApprovePending(ctx, "node-1", "someone-else", at(25*time.Minute))
		wantErr(t, "second ApprovePending", err, store.ErrNotFound)
		wantEqual(t, "GetPending(p1) after the second approval", normPending, mustGetPending(t, s, "p1"), earlier)
	}},
	{"approving an unknown node is not found", func(t *testing.T, s store.Store) {
		mustCreatePending(t, s, newPending("p1", "node-1", "tok1", at(0)))
		_, err := s.ApprovePending(t.Context(), "node-2", "owner@example.org", at(time.Minute))
		wantErr(t, "ApprovePending(unknown node)", err, store.ErrNotFound)
		if p := mustGetPending(t, s, "p1"); !p.ApprovedAt.IsZero() || p.ApprovedBy != "" {
			t.Errorf("another node's pending join was approved: %+v", p)
		}
	}},
	{"approving skips expired pending joins", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		now := at(time.Hour)
		gone := newPending("p-gone", "node-1", "tok1", at(-time.Hour)) // expired at(0)
		atNow := newPending("p-at-now", "node-1", "tok2", at(0))       // expires exactly now
		live := newPending("p-live", "node-1", "tok3", at(30*time.Minute))
		stale := newPending("p-stale", "node-2", "tok4", at(0)) // node-2 has only this one
		for _, p := range []store.Pending{gone, atNow, live, stale} {
			mustCreatePending(t, s, p)
		}
		ps, err := s.ApprovePending(ctx, "node-1", "owner@example.org", now)
		if err != nil {
			t.Fatalf("ApprovePending: %v", err)
		}
		wantPendingIDs(t, "ApprovePending", ps, "p-live")
		for _, p := range []store.Pending{gone, atNow} {
			wantEqual(t, "expired pending join "+p.ID, normPending, mustGetPending(t, s, p.ID), p)
		}
		_, err = s.ApprovePending(ctx, "node-2", "owner@example.org", now)
		wantErr(t, "ApprovePending(node with only expired pending joins)", err, store.ErrNotFound)
		wantEqual(t, "expired pending join p-stale", normPending, mustGetPending(t, s, "p-stale"), stale)
	}},
	{"a join completing an approved pending join removes it", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		tok := newToken("tok1", at(0))
		tok.RequireApproval = true
		mustCreateToken(t, s, tok)
		mustCreatePending(t, s, newPending("p1", "node-1", "tok1", at(time.Minute)))
		other := newPending("p2", "node-2", "tok2", at(time.Minute))
		mustCreatePending(t, s, other)
		if _, err := s.ApprovePending(ctx, "node-1", "owner@example.org", at(2*time.Minute)); err != nil {
			t.Fatalf("ApprovePending: %v", err)
		}

		j := newJoin("tok1", "node-1", "s1", at(3*time.Minute))
		j.PendingID = "p1"
		mustJoin(t, s, j)
		_, err := s.GetPending(ctx, "p1")
		wantErr(t, "GetPending of the completed pending join", err, store.ErrNotFound)
		wantEqual(t, "joined node", normNode, mustGetNode(t, s, "node-1"), j.Node)
		if tok := mustGetToken(t, s, "tok1"); tok.UsedBy != "node-1" || !tok.UsedAt.Equal(at(3*time.Minute)) {
			t.Errorf("token: UsedAt %v, UsedBy %q; want %v, node-1", tok.UsedAt, tok.UsedBy, at(3*time.Minute))
		}
		wantEqual(t, "another pending join", normPending, mustGetPending(t, s, "p2"), other)
		ps, err := s.ListPending(ctx, at(3*time.Minute))
		if err != nil {
			t.Fatalf("ListPending: %v", err)
		}
		wantPendingIDs(t, "ListPending", ps, "p2")

		// The pending join completes once.
		again := newJoin("", "node-1", "s2", at(4*time.Minute))
		again.PendingID, again.Reclaim = "p1", true
		wantErr(t, "second join completing p1", s.CompleteJoin(ctx, again), store.ErrConflict)
		_, err = s.GetCert(ctx, "s2")
		wantErr(t, "certificate of the refused join", err, store.ErrNotFound)
	}},
	{"a join completing an unapproved pending join is a conflict and leaves the token unspent", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		p := newPending("p1", "node-1", "tok1", at(time.Minute))
		mustCreatePending(t, s, p)
		j := newJoin("tok1", "node-1", "s1", at(2*time.Minute))
		j.PendingID = "p1"
		wantErr(t, "join completing an unapproved pending join", s.CompleteJoin(t.Context(), j), store.ErrConflict)
		wantRefusedJoin(t, s, "tok1", "node-1", "s1")
		wantEqual(t, "pending join after the refused join", normPending, mustGetPending(t, s, "p1"), p)
	}},
	{"a join completing an unknown pending join is a conflict and leaves the token unspent", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		j := newJoin("tok1", "node-1", "s1", at(time.Minute))
		j.PendingID = "p1"
		wantErr(t, "join completing an unknown pending join", s.CompleteJoin(t.Context(), j), store.ErrConflict)
		wantRefusedJoin(t, s, "tok1", "node-1", "s1")
	}},
	{"a join completing a pending join of another node or token is a conflict", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustCreateToken(t, s, newToken("tok1", at(0)))
		mustCreateToken(t, s, newToken("tok2", at(0)))
		p := newPending("p1", "node-1", "tok1", at(time.Minute))
		mustCreatePending(t, s, p)
		approved, err := s.ApprovePending(ctx, "node-1", "owner@example.org", at(2*time.Minute))
		if err != nil || len(approved) != 1 {
			t.Fatalf("ApprovePending = %v, %v; want p1", approved, err)
		}
		otherNode := newJoin("tok1", "node-2", "s1", at(3*time.Minute))
		otherNode.PendingID = "p1"
		otherToken := newJoin("tok2", "node-1", "s1", at(3*time.Minute))
		otherToken.PendingID = "p1"
		noToken := newJoin("", "node-1", "s1", at(3*time.Minute))
		noToken.PendingID = "p1"
		for name, j := range map[string]store.Join{"another node": otherNode, "another token": otherToken, "no token": noToken} {
			wantErr(t, "join completing p1 with "+name, s.CompleteJoin(ctx, j), store.ErrConflict)
		}
		wantRefusedJoin(t, s, "tok1", "node-1", "s1")
		wantUnspent(t, s, "tok2")
		wantNoNode(t, s, "node-2")
		wantEqual(t, "pending join after the refused joins", normPending, mustGetPending(t, s, "p1"), approved[0])
	}},
}

// newPending returns an unapproved pending join id of node made with the
// token named token at created, expiring an hour later.
func newPending(id, node, token string, created time.Time) store.Pending {
	return store.Pending{
		ID:        id,
		TokenHash: hashOf(token),
		TokenID:   token,
		CSRHash:   hashOf("csr-" + id),
		NodeID:    node,
		Role:      "worker",
		Site:      "site-a",
		Claims:    newNode(node, 1, "", created).Claims,
		CreatedAt: created,
		ExpiresAt: created.Add(time.Hour),
	}
}

// mustCreatePending stores p or fails the test.
func mustCreatePending(t *testing.T, s store.Store, p store.Pending) {
	t.Helper()
	if err := s.CreatePending(t.Context(), p); err != nil {
		t.Fatalf("CreatePending(%s): %v", p.ID, err)
	}
}

// mustGetPending reads the pending join id or fails the test.
func mustGetPending(t *testing.T, s store.Store, id string) store.Pending {
	t.Helper()
	p, err := s.GetPending(t.Context(), id)
	if err != nil {
		t.Fatalf("GetPending(%s): %v", id, err)
	}
	return p
}

func normPending(p store.Pending) store.Pending {
	p.CreatedAt, p.ExpiresAt, p.ApprovedAt = normTime(p.CreatedAt), normTime(p.ExpiresAt), normTime(p.ApprovedAt)
	p.Claims.Serials, p.Claims.MACs, p.Claims.GPUUUIDs = normList(p.Claims.Serials), normList(p.Claims.MACs), normList(p.Claims.GPUUUIDs)
	if len(p.TokenHash) == 0 {
		p.TokenHash = nil
	}
	if len(p.CSRHash) == 0 {
		p.CSRHash = nil
	}
	return p
}

// wantPendingIDs fails the test unless the pending joins have exactly the
// ids want, in that order.
func wantPendingIDs(t *testing.T, what string, ps []store.Pending, want ...string) {
	t.Helper()
	got := []string{}
	for _, p := range ps {
		got = append(got, p.ID)
	}
	if want == nil {
		want = []string{}
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: pending joins %q, want %q", what, got, want)
	}
}

// wantRefusedJoin fails the test if a refused join of node with
// certificate serial left a trace: the node, the certificate, or the token
// named token spent.
func wantRefusedJoin(t *testing.T, s store.Store, token, node, serial string) {
	t.Helper()
	wantNoNode(t, s, node)
	wantUnspent(t, s, token)
	_, err := s.GetCert(t.Context(), serial)
	wantErr(t, fmt.Sprintf("certificate %s of the refused join", serial), err, store.ErrNotFound)
}
