package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var joinCases = []testCase{
	{"a join spends its token once", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		j := newJoin("tok1", "node-1", "s1", at(time.Minute))
		mustJoin(t, s, j)

		tok := mustGetToken(t, s, "tok1")
		if !tok.UsedAt.Equal(at(time.Minute)) || tok.UsedBy != "node-1" {
			t.Errorf("spent token: UsedAt %v, UsedBy %q; want %v, node-1", tok.UsedAt, tok.UsedBy, at(time.Minute))
		}
		wantEqual(t, "joined node", normNode, mustGetNode(t, s, "node-1"), j.Node)
		wantEqual(t, "join certificate", normCert, mustGetCert(t, s, "s1"), j.Cert)

		again := newJoin("tok1", "node-2", "s2", at(2*time.Minute))
		wantErr(t, "second join with the token", s.CompleteJoin(t.Context(), again), store.ErrConflict)
		wantNoNode(t, s, "node-2")
		_, err := s.GetCert(t.Context(), "s2")
		wantErr(t, "certificate of the refused join", err, store.ErrNotFound)
		if tok := mustGetToken(t, s, "tok1"); !tok.UsedAt.Equal(at(time.Minute)) || tok.UsedBy != "node-1" {
			t.Errorf("token after the refused join: UsedAt %v, UsedBy %q; want the first use", tok.UsedAt, tok.UsedBy)
		}
	}},
	{"an expired token is refused and writes nothing", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0))) // expires at(time.Hour)
		for _, now := range []time.Time{at(time.Hour), at(2 * time.Hour)} {
			err := s.CompleteJoin(t.Context(), newJoin("tok1", "node-1", "s1", now))
			wantErr(t, "join at "+now.String(), err, store.ErrConflict)
		}
		wantNoNode(t, s, "node-1")
		wantUnspent(t, s, "tok1")
		_, err := s.GetCert(t.Context(), "s1")
		wantErr(t, "certificate of the refused join", err, store.ErrNotFound)

		mustJoin(t, s, newJoin("tok1", "node-1", "s1", at(time.Hour-time.Microsecond)))
	}},
	{"an unknown token is refused and writes nothing", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		err := s.CompleteJoin(t.Context(), newJoin("nope", "node-1", "s1", at(time.Minute)))
		wantErr(t, "join with an unknown token", err, store.ErrConflict)
		wantNoNode(t, s, "node-1")
		wantUnspent(t, s, "tok1")
	}},
	{"a node's LAK name is kept and a reclaim writes the one it carries", func(t *testing.T, s store.Store) {
		j := newJoin("", "node-1", "s1", at(0))
		j.Node.Attestor, j.Node.LAKName = "tpm", []byte{0x00, 0x0b, 0xde, 0xad, 0x00}
		mustJoin(t, s, j)
		wantEqual(t, "node joined with its LAK", normNode, mustGetNode(t, s, "node-1"), j.Node)
		if got := mustGetNode(t, s, "node-1").LAKName; string(got) != string(j.Node.LAKName) {
			t.Fatalf("LAKName = %x, want %x", got, j.Node.LAKName)
		}
		again := store.Join{Now: at(time.Minute), Node: newNode("node-1", 2, "s2", at(time.Minute)), Reclaim: true,
			Cert: newCert("s2", "node-1", 2, "join", at(time.Minute))}
		again.Node.LAKName = []byte{0x00, 0x0b, 0xbe, 0xef}
		mustJoin(t, s, again)
		if got := mustGetNode(t, s, "node-1").LAKName; string(got) != string(again.Node.LAKName) {
			t.Fatalf("LAKName after the reclaim = %x, want %x", got, again.Node.LAKName)
		}
		third := store.Join{Now: at(2 * time.Minute), Node: newNode("node-1", 3, "s3", at(2*time.Minute)), Reclaim: true,
			Cert: newCert("s3", "node-1", 3, "join", at(2*time.Minute))}
		mustJoin(t, s, third)
		if got := mustGetNode(t, s, "node-1").LAKName; len(got) != 0 {
			t.Fatalf("LAKName after a reclaim without one = %x, want none", got)
		}
	}},
	{"a join without a token writes the node and its certificate", func(t *testing.T, s store.Store) {
		j := newJoin("", "node-1", "s1", at(0))
		j.Node.Attestor = "tpm"
		mustJoin(t, s, j)
		wantEqual(t, "joined node", normNode, mustGetNode(t, s, "node-1"), j.Node)
		wantEqual(t, "join certificate", normCert, mustGetCert(t, s, "s1"), j.Cert)
	}},
	{"a node without claims or times reads back empty", func(t *testing.T, s store.Store) {
		j := store.Join{
			Now:  at(0),
			Node: store.Node{ID: "node-1", State: store.StatePlanned},
			Cert: store.Cert{Serial: "s1", NodeID: "node-1"},
		}
		mustJoin(t, s, j)
		wantEqual(t, "bare node", normNode, mustGetNode(t, s, "node-1"), j.Node)
		wantEqual(t, "bare certificate", normCert, mustGetCert(t, s, "s1"), j.Cert)
	}},
	{"a join of a known node without reclaim is a conflict and leaves the token unspent", func(t *testing.T, s store.Store) {
		first := newJoin("", "node-1", "s1", at(0))
		mustJoin(t, s, first)
		mustCreateToken(t, s, newToken("tok2", at(time.Minute)))
		again := newJoin("tok2", "node-1", "s2", at(2*time.Minute))
		again.Node.Claims.Hostname = "impostor"
		wantErr(t, "join of a known node", s.CompleteJoin(t.Context(), again), store.ErrConflict)
		wantUnspent(t, s, "tok2")
		wantEqual(t, "node after the refused join", normNode, mustGetNode(t, s, "node-1"), first.Node)
		_, err := s.GetCert(t.Context(), "s2")
		wantErr(t, "certificate of the refused join", err, store.ErrNotFound)
		if c := mustGetCert(t, s, "s1"); !c.RevokedAt.IsZero() {
			t.Errorf("the refused join revoked %s: %+v", c.Serial, c)
		}
	}},
	{"a reclaim replaces the node and revokes its live certificates", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		if _, _, err := s.RevokeNode(ctx, "node-1", "stolen", at(5*time.Minute), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		// The stolen machine comes back with a reclaiming token.
		tok := newToken("tok1", at(0))
		tok.AllowReclaim = true
		mustCreateToken(t, s, tok)
		second := store.Join{
			TokenHash: hashOf("tok1"),
			Now:       at(10 * time.Minute),
			Node:      newNode("node-1", 3, "s2", at(10*time.Minute)),
			Reclaim:   true,
			Cert:      newCert("s2", "node-1", 3, "join", at(10*time.Minute)),
		}
		mustJoin(t, s, second)
		if err := s.RecordRenewal(ctx, newCert("s3", "node-1", 3, "renew", at(20*time.Minute)), nil); err != nil {
			t.Fatalf("RecordRenewal: %v", err)
		}

		// It is reinstalled on other hardware and reclaimed again.
		third := store.Join{
			Now:     at(30 * time.Minute),
			Node:    newNode("node-1", 4, "s4", at(30*time.Minute)),
			Reclaim: true,
			Cert:    newCert("s4", "node-1", 4, "join", at(30*time.Minute)),
		}
		third.Node.Attestor = "tpm"
		third.Node.Claims = store.Claims{ProductUUID: "uuid-new", Serials: []string{"board-new"}, Hostname: "new"}
		mustJoin(t, s, third)

		wantEqual(t, "reclaimed node", normNode, mustGetNode(t, s, "node-1"), third.Node)
		if c := mustGetCert(t, s, "s1"); c.RevokedReason != "stolen" || !c.RevokedAt.Equal(at(5*time.Minute)) {
			t.Errorf("a certificate revoked before the reclaim changed: %+v", c)
		}
		for _, serial := range []string{"s2", "s3"} {
			if c := mustGetCert(t, s, serial); c.RevokedReason != "reclaimed" || !c.RevokedAt.Equal(at(30*time.Minute)) {
				t.Errorf("certificate %s after the reclaim: RevokedAt %v, reason %q; want %v, reclaimed",
					serial, c.RevokedAt, c.RevokedReason, at(30*time.Minute))
			}
		}
		wantEqual(t, "new certificate", normCert, mustGetCert(t, s, "s4"), third.Cert)

		old, err := s.NodesByClaims(ctx, "uuid-node-1", []string{"board-node-1"})
		if err != nil {
			t.Fatalf("NodesByClaims: %v", err)
		}
		wantIDs(t, "nodes with the replaced claims", old)
		found, err := s.NodesByClaims(ctx, "", []string{"board-new"})
		if err != nil {
			t.Fatalf("NodesByClaims: %v", err)
		}
		wantIDs(t, "nodes with the new claims", found, "node-1")
	}},
	{"a reclaim of an unknown node writes it", func(t *testing.T, s store.Store) {
		j := newJoin("", "node-1", "s1", at(0))
		j.Reclaim = true
		mustJoin(t, s, j)
		wantEqual(t, "node", normNode, mustGetNode(t, s, "node-1"), j.Node)
	}},
	{"a join whose certificate serial exists is a conflict and leaves the token unspent", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		mustCreateToken(t, s, newToken("tok2", at(0)))
		err := s.CompleteJoin(t.Context(), newJoin("tok2", "node-2", "s1", at(time.Minute)))
		wantErr(t, "join reusing a serial", err, store.ErrConflict)
		wantNoNode(t, s, "node-2")
		wantUnspent(t, s, "tok2")
		if c := mustGetCert(t, s, "s1"); c.NodeID != "node-1" {
			t.Errorf("certificate s1 now names node %q", c.NodeID)
		}
	}},
	{"a join whose certificate names another node or generation is refused", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		otherNode := newJoin("tok1", "node-1", "s1", at(time.Minute))
		otherNode.Cert.NodeID = "node-2"
		otherGen := newJoin("tok1", "node-1", "s1", at(time.Minute))
		otherGen.Cert.Generation = 7
		for name, j := range map[string]store.Join{"another node": otherNode, "another generation": otherGen} {
			if err := s.CompleteJoin(t.Context(), j); err == nil {
				t.Errorf("join whose certificate names %s succeeded", name)
			}
		}
		wantNoNode(t, s, "node-1")
		wantUnspent(t, s, "tok1")
	}},
	{"a join appends its audit event in its transaction", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		j := newJoin("tok1", "node-1", "s1", at(time.Minute))
		j.Audit = newAudit("join", "node-1", at(time.Minute))
		mustJoin(t, s, j)
		wantEqual(t, "joined node", normNode, mustGetNode(t, s, "node-1"), j.Node)
		wantAudit(t, "audit trail after the join", s, j.Audit)

		mustJoin(t, s, newJoin("", "node-2", "s2", at(2*time.Minute)))
		wantAudit(t, "audit trail after a join without an event", s, j.Audit)
	}},
	{"a refused join writes neither its node nor its audit event", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		mustCreateToken(t, s, newToken("tok2", at(0)))
		mustJoin(t, s, newJoin("tok1", "node-1", "s1", at(time.Minute)))
		refused := map[string]store.Join{
			"a used token":     newJoin("tok1", "node-2", "s2", at(2*time.Minute)),
			"an unknown token": newJoin("nope", "node-3", "s3", at(2*time.Minute)),
			"a known node":     newJoin("tok2", "node-1", "s4", at(2*time.Minute)),
			"a known serial":   newJoin("tok2", "node-5", "s1", at(2*time.Minute)),
			"an expired token": newJoin("tok2", "node-6", "s6", at(2*time.Hour)),
		}
		for name, j := range refused {
			j.Audit = newAudit("join", j.Node.ID, j.Now)
			wantErr(t, "join with "+name, s.CompleteJoin(t.Context(), j), store.ErrConflict)
		}
		j := newJoin("tok2", "node-7", "s7", at(2*time.Minute))
		j.Audit = newAudit("join", "node-7", j.Now)
		wantErr(t, "join with a cancelled context", s.CompleteJoin(cancelled(t), j), context.Canceled)

		for _, id := range []string{"node-2", "node-3", "node-5", "node-6", "node-7"} {
			wantNoNode(t, s, id)
		}
		wantUnspent(t, s, "tok2")
		wantAudit(t, "audit trail after the refused joins", s)
	}},
	{"a join with a cancelled context fails and writes nothing", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		err := s.CompleteJoin(cancelled(t), newJoin("tok1", "node-1", "s1", at(time.Minute)))
		wantErr(t, "join with a cancelled context", err, context.Canceled)
		wantNoNode(t, s, "node-1")
		wantUnspent(t, s, "tok1")
	}},
}
