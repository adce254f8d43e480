package storetest

import (
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var revokedCertCases = []testCase{
	{"revoked certificates not yet expired are listed, latest revocation first", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		for _, n := range []string{"node-1", "node-2", "node-3", "node-4"} {
			mustJoin(t, s, newJoin("", n, "s-"+n, at(0)))
		}
		// node-1 revoked at 1h, node-2 deleted at 2h, node-3 revoked at
		// 3h; node-4 never.
		if _, _, err := s.RevokeNode(ctx, "node-1", "lost", at(time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		if _, _, err := s.DeleteNode(ctx, "node-2", "retired", at(2*time.Hour), nil); err != nil {
			t.Fatalf("DeleteNode: %v", err)
		}
		if _, _, err := s.RevokeNode(ctx, "node-3", "stolen", at(3*time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		want := []wantRevoked{{"s-node-3", "node-3", at(3 * time.Hour)}, {"s-node-2", "node-2", at(2 * time.Hour)}, {"s-node-1", "node-1", at(time.Hour)}}
		wantRevokedCerts(t, s, "revoked certificates", at(4*time.Hour), 10, want)
		wantRevokedCerts(t, s, "revoked certificates, limit 2", at(4*time.Hour), 2, want[:2])
		// The certificates (issued at 0) expire at 24h: then none is left.
		wantRevokedCerts(t, s, "revoked certificates once expired", at(24*time.Hour), 10, nil)
		if _, err := s.RevokedCerts(ctx, at(0), 0); err == nil {
			t.Errorf("RevokedCerts with limit 0 succeeded; want an error")
		}
	}},
	{"each revoked certificate is listed until it expires", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		if err := s.RecordRenewal(ctx, newCert("s2", "node-1", 1, "renew", at(2*time.Hour)), nil); err != nil {
			t.Fatalf("RecordRenewal: %v", err)
		}
		if _, _, err := s.RevokeNode(ctx, "node-1", "stolen", at(5*time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		// s1 expires at 24h, s2 at 26h.
		wantRevokedCerts(t, s, "at 6h", at(6*time.Hour), 10, []wantRevoked{{"s1", "node-1", at(5 * time.Hour)}, {"s2", "node-1", at(5 * time.Hour)}})
		wantRevokedCerts(t, s, "at 25h", at(25*time.Hour), 10, []wantRevoked{{"s2", "node-1", at(5 * time.Hour)}})
		wantRevokedCerts(t, s, "at 26h", at(26*time.Hour), 10, nil)
	}},
}

type wantRevoked struct {
	serial, node string
	revokedAt    time.Time
}

func wantRevokedCerts(t *testing.T, s store.Store, what string, now time.Time, limit int, want []wantRevoked) {
	t.Helper()
	got, err := s.RevokedCerts(t.Context(), now, limit)
	if err != nil {
		t.Fatalf("%s: RevokedCerts: %v", what, err)
	}
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].Serial == want[i].serial && got[i].NodeID == want[i].node && got[i].RevokedAt.Equal(want[i].revokedAt)
	}
	if !ok {
		t.Errorf("%s = %+v, want %+v", what, got, want)
	}
}
