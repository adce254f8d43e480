package storetest

import (
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var revokedNodeCases = []testCase{
	{"revoked nodes are those with a revoked certificate not yet expired, newest revocation first", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		for _, n := range []string{"node-1", "node-2", "node-3", "node-4"} {
			mustJoin(t, s, newJoin("", n, "s-"+n, at(0)))
		}
		// node-1 revoked at 1h, node-2 at 2h and deleted, node-3 at 3h;
		// node-4 never.
		if _, _, err := s.RevokeNode(ctx, "node-1", "lost", at(time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		if _, _, err := s.DeleteNode(ctx, "node-2", "retired", at(2*time.Hour), nil); err != nil {
			t.Fatalf("DeleteNode: %v", err)
		}
		if _, _, err := s.RevokeNode(ctx, "node-3", "stolen", at(3*time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		got, err := s.RevokedNodes(ctx, at(4*time.Hour), 10)
		if err != nil {
			t.Fatalf("RevokedNodes: %v", err)
		}
		want := []store.RevokedNode{{NodeID: "node-3", RevokedAt: at(3 * time.Hour)}, {NodeID: "node-2", RevokedAt: at(2 * time.Hour)}, {NodeID: "node-1", RevokedAt: at(time.Hour)}}
		wantRevokedNodes(t, "revoked nodes", got, want)

		got, err = s.RevokedNodes(ctx, at(4*time.Hour), 2)
		if err != nil {
			t.Fatalf("RevokedNodes with a limit: %v", err)
		}
		wantRevokedNodes(t, "revoked nodes, limit 2", got, want[:2])

		// The certificates (issued at 0) expire at 24h: then none is left.
		got, err = s.RevokedNodes(ctx, at(24*time.Hour), 10)
		if err != nil {
			t.Fatalf("RevokedNodes after expiry: %v", err)
		}
		wantRevokedNodes(t, "revoked nodes once their certificates expired", got, nil)

		if _, err := s.RevokedNodes(ctx, at(0), 0); err == nil {
			t.Errorf("RevokedNodes with limit 0 succeeded; want an error")
		}
	}},
	{"a revoked node is listed while any of its revoked certificates has not expired", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		if err := s.RecordRenewal(ctx, newCert("s2", "node-1", 1, "renew", at(2*time.Hour)), nil); err != nil {
			t.Fatalf("RecordRenewal: %v", err)
		}
		if _, _, err := s.RevokeNode(ctx, "node-1", "stolen", at(5*time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		want := []store.RevokedNode{{NodeID: "node-1", RevokedAt: at(5 * time.Hour)}}
		// s1 expires at 24h, s2 at 26h.
		for _, now := range []time.Duration{6 * time.Hour, 25 * time.Hour} {
			got, err := s.RevokedNodes(ctx, at(now), 10)
			if err != nil {
				t.Fatalf("RevokedNodes: %v", err)
			}
			wantRevokedNodes(t, "revoked nodes at "+now.String(), got, want)
		}
		got, err := s.RevokedNodes(ctx, at(26*time.Hour), 10)
		if err != nil {
			t.Fatalf("RevokedNodes: %v", err)
		}
		wantRevokedNodes(t, "revoked nodes once both certificates expired", got, nil)
	}},
}

func wantRevokedNodes(t *testing.T, what string, got, want []store.RevokedNode) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].NodeID == want[i].NodeID && got[i].RevokedAt.Equal(want[i].RevokedAt)
	}
	if !ok {
		t.Errorf("%s = %+v, want %+v", what, got, want)
	}
}
