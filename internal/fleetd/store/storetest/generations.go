package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var generationCases = []testCase{
	{"the next generation is 1 for an unknown id and one above a live node's", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		wantNextGeneration(t, s, "node-1", 1)
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		wantNextGeneration(t, s, "node-1", 2)
		if _, _, err := s.RevokeNode(ctx, "node-1", "compromised", at(time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		wantNextGeneration(t, s, "node-1", 3)
		wantNextGeneration(t, s, "node-2", 1)
	}},
	{"after a deletion the next generation is one above the tombstone", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		mustJoin(t, s, newJoin("", "node-2", "t1", at(0)))
		if _, _, err := s.RevokeNode(ctx, "node-1", "compromised", at(time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		// The deletion revokes at generation 3 and leaves it behind.
		if _, _, err := s.DeleteNode(ctx, "node-1", "decommissioned", at(2*time.Hour), nil); err != nil {
			t.Fatalf("DeleteNode: %v", err)
		}
		wantNoNode(t, s, "node-1")
		wantNextGeneration(t, s, "node-1", 4)
		wantNextGeneration(t, s, "node-2", 2)
	}},
	{"a join at or below the tombstone's generation is refused and writes nothing", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		if _, _, err := s.DeleteNode(ctx, "node-1", "decommissioned", at(time.Hour), nil); err != nil {
			t.Fatalf("DeleteNode: %v", err) // tombstone at generation 2
		}
		mustCreateToken(t, s, newToken("tok1", at(time.Hour)))
		for _, gen := range []uint64{1, 2} {
			for _, reclaim := range []bool{false, true} {
				j := newJoin("tok1", "node-1", "s2", at(time.Hour+time.Minute))
				j.Node.Generation, j.Cert.Generation = gen, gen
				j.Reclaim = reclaim
				j.Audit = newAudit("join", "node-1", j.Now)
				err := s.CompleteJoin(ctx, j)
				wantErr(t, fmt.Sprintf("join at generation %d (reclaim %t)", gen, reclaim), err, store.ErrConflict)
			}
		}
		wantNoNode(t, s, "node-1")
		wantUnspent(t, s, "tok1")
		_, err := s.GetCert(ctx, "s2")
		wantErr(t, "certificate of the refused join", err, store.ErrNotFound)
		wantAudit(t, "audit trail after the refused joins", s)
		if c := mustGetCert(t, s, "s1"); c.RevokedReason != "decommissioned" {
			t.Errorf("a refused join changed the deleted node's certificate: %+v", c)
		}
		wantNextGeneration(t, s, "node-1", 3)
	}},
	{"a join at the next generation after a deletion succeeds", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		if _, _, err := s.DeleteNode(ctx, "node-1", "decommissioned", at(time.Hour), nil); err != nil {
			t.Fatalf("DeleteNode: %v", err)
		}
		gen := wantNextGeneration(t, s, "node-1", 3)
		mustCreateToken(t, s, newToken("tok1", at(time.Hour)))
		j := newJoin("tok1", "node-1", "s2", at(time.Hour+time.Minute))
		j.Node.Generation, j.Cert.Generation = gen, gen
		mustJoin(t, s, j)
		wantEqual(t, "node joined after deletion", normNode, mustGetNode(t, s, "node-1"), j.Node)
		wantEqual(t, "its certificate", normCert, mustGetCert(t, s, "s2"), j.Cert)
		wantNextGeneration(t, s, "node-1", 4)

		// A second deletion raises the tombstone past the first.
		if _, _, err := s.DeleteNode(ctx, "node-1", "again", at(3*time.Hour), nil); err != nil {
			t.Fatalf("second DeleteNode: %v", err)
		}
		wantNextGeneration(t, s, "node-1", 5)
		again := newJoin("", "node-1", "s3", at(4*time.Hour))
		again.Node.Generation, again.Cert.Generation = 4, 4
		wantErr(t, "join at the second deletion's generation", s.CompleteJoin(ctx, again), store.ErrConflict)
		wantNoNode(t, s, "node-1")
	}},
}

// wantNextGeneration fails the test unless NextGeneration(id) is want, and
// returns what it returned.
func wantNextGeneration(t *testing.T, s store.Store, id string, want uint64) uint64 {
	t.Helper()
	got, err := s.NextGeneration(t.Context(), id)
	if err != nil {
		t.Fatalf("NextGeneration(%s): %v", id, err)
	}
	if got != want {
		t.Errorf("NextGeneration(%s) = %d, want %d", id, got, want)
	}
	return got
}
