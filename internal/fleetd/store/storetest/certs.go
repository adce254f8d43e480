package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var certCases = []testCase{
	{"a renewal records the certificate and updates the node", func(t *testing.T, s store.Store) {
		j := newJoin("", "node-1", "s1", at(0))
		mustJoin(t, s, j)
		c := newCert("s2", "node-1", 1, "renew", at(time.Hour))
		if err := s.RecordRenewal(t.Context(), c, nil); err != nil {
			t.Fatalf("RecordRenewal: %v", err)
		}
		wantEqual(t, "renewed certificate", normCert, mustGetCert(t, s, "s2"), c)
		want := j.Node
		want.CertSerial, want.CertNotAfter, want.LastSeen = "s2", c.NotAfter, c.IssuedAt
		wantEqual(t, "renewed node", normNode, mustGetNode(t, s, "node-1"), want)
		if old := mustGetCert(t, s, "s1"); !old.RevokedAt.IsZero() {
			t.Errorf("the renewal revoked the previous certificate: %+v", old)
		}
	}},
	{"a renewal after a revocation is a conflict", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		if _, _, err := s.RevokeNode(t.Context(), "node-1", "compromised", at(time.Minute), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		before := mustGetNode(t, s, "node-1")
		err := s.RecordRenewal(t.Context(), newCert("s2", "node-1", 1, "renew", at(2*time.Minute)), nil)
		wantErr(t, "renewal at the old generation", err, store.ErrConflict)
		_, err = s.GetCert(t.Context(), "s2")
		wantErr(t, "certificate of the refused renewal", err, store.ErrNotFound)
		wantEqual(t, "node after the refused renewal", normNode, mustGetNode(t, s, "node-1"), before)
	}},
	{"a renewal of an unknown node is a conflict", func(t *testing.T, s store.Store) {
		err := s.RecordRenewal(t.Context(), newCert("s1", "node-1", 1, "renew", at(0)), nil)
		wantErr(t, "renewal of an unknown node", err, store.ErrConflict)
		_, err = s.GetCert(t.Context(), "s1")
		wantErr(t, "certificate of the refused renewal", err, store.ErrNotFound)
	}},
	{"a renewal whose serial exists is a conflict", func(t *testing.T, s store.Store) {
		j := newJoin("", "node-1", "s1", at(0))
		mustJoin(t, s, j)
		err := s.RecordRenewal(t.Context(), newCert("s1", "node-1", 1, "renew", at(time.Hour)), nil)
		wantErr(t, "renewal reusing a serial", err, store.ErrConflict)
		wantEqual(t, "certificate", normCert, mustGetCert(t, s, "s1"), j.Cert)
		wantEqual(t, "node", normNode, mustGetNode(t, s, "node-1"), j.Node)
	}},
	{"a renewal appends its audit event in its transaction; a refused one writes none", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		ev := newAudit("renew", "node-1", at(time.Hour))
		if err := s.RecordRenewal(ctx, newCert("s2", "node-1", 1, "renew", at(time.Hour)), ev); err != nil {
			t.Fatalf("RecordRenewal: %v", err)
		}
		wantAudit(t, "audit trail after the renewal", s, ev)

		for name, c := range map[string]store.Cert{
			"a known serial":     newCert("s2", "node-1", 1, "renew", at(2*time.Hour)),
			"another generation": newCert("s3", "node-1", 2, "renew", at(2*time.Hour)),
			"an unknown node":    newCert("s4", "node-9", 1, "renew", at(2*time.Hour)),
		} {
			err := s.RecordRenewal(ctx, c, newAudit("renew", c.NodeID, c.IssuedAt))
			wantErr(t, "renewal with "+name, err, store.ErrConflict)
		}
		if err := s.RecordRenewal(ctx, newCert("s5", "node-1", 1, "renew", at(3*time.Hour)), nil); err != nil {
			t.Fatalf("RecordRenewal without an event: %v", err)
		}
		wantAudit(t, "audit trail after the refused renewals and one without an event", s, ev)
	}},
	{"a renewal with a cancelled context fails and writes nothing", func(t *testing.T, s store.Store) {
		j := newJoin("", "node-1", "s1", at(0))
		mustJoin(t, s, j)
		c := newCert("s2", "node-1", 1, "renew", at(time.Hour))
		err := s.RecordRenewal(cancelled(t), c, newAudit("renew", "node-1", c.IssuedAt))
		wantErr(t, "renewal with a cancelled context", err, context.Canceled)
		_, err = s.GetCert(t.Context(), "s2")
		wantErr(t, "certificate of the cancelled renewal", err, store.ErrNotFound)
		wantEqual(t, "node after the cancelled renewal", normNode, mustGetNode(t, s, "node-1"), j.Node)
		wantAudit(t, "audit trail after the cancelled renewal", s)
	}},
	{"an unknown certificate is not found", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		_, err := s.GetCert(t.Context(), "s2")
		wantErr(t, "GetCert(unknown)", err, store.ErrNotFound)
	}},
	{"certificates are counted from a time on", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		mustJoin(t, s, newJoin("", "node-2", "t1", at(0)))
		for i, serial := range []string{"s2", "s3", "s4"} {
			if err := s.RecordRenewal(ctx, newCert(serial, "node-1", 1, "renew", at(time.Duration(i+1)*10*time.Minute)), nil); err != nil {
				t.Fatalf("RecordRenewal(%s): %v", serial, err)
			}
		}
		if err := s.RecordRenewal(ctx, newCert("t2", "node-2", 1, "renew", at(30*time.Minute)), nil); err != nil {
			t.Fatalf("RecordRenewal(t2): %v", err)
		}
		// node-1 has certificates issued at 0, 10, 20 and 30 minutes.
		for _, q := range []struct {
			node  string
			since time.Time
			want  int
		}{
			{"node-1", time.Time{}, 4},
			{"node-1", at(-time.Hour), 4},
			{"node-1", at(0), 4},
			{"node-1", at(time.Microsecond), 3},
			{"node-1", at(20 * time.Minute), 2},
			{"node-1", at(30 * time.Minute), 1},
			{"node-1", at(31 * time.Minute), 0},
			{"node-2", at(time.Minute), 1},
			{"node-9", time.Time{}, 0},
		} {
			n, err := s.CountCerts(ctx, q.node, q.since)
			if err != nil {
				t.Fatalf("CountCerts(%s, %v): %v", q.node, q.since, err)
			}
			if n != q.want {
				t.Errorf("CountCerts(%s, %v) = %d, want %d", q.node, q.since, n, q.want)
			}
		}
		// Revoked certificates still count: they were issued.
		if _, _, err := s.RevokeNode(ctx, "node-1", "test", at(time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		if n, err := s.CountCerts(ctx, "node-1", at(0)); err != nil || n != 4 {
			t.Errorf("CountCerts after revocation = %d, %v; want 4", n, err)
		}
	}},
	{"a node's certificates are listed newest first, across generations, within the limit", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		j := newJoin("", "node-1", "s1", at(0))
		mustJoin(t, s, j)
		mustJoin(t, s, newJoin("", "node-2", "t1", at(0)))
		r1 := newCert("s2", "node-1", 1, "renew", at(10*time.Minute))
		r2 := newCert("s3", "node-1", 1, "renew", at(20*time.Minute))
		// Recorded out of time order, so that insertion order is not the
		// answer.
		for _, c := range []store.Cert{r2, r1, newCert("t2", "node-2", 1, "renew", at(15*time.Minute))} {
			if err := s.RecordRenewal(ctx, c, nil); err != nil {
				t.Fatalf("RecordRenewal(%s): %v", c.Serial, err)
			}
		}
		if _, _, err := s.RevokeNode(ctx, "node-1", "compromised", at(30*time.Minute), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		reclaim := store.Join{
			Now:     at(40 * time.Minute),
			Node:    newNode("node-1", 3, "s4", at(40*time.Minute)),
			Reclaim: true,
			Cert:    newCert("s4", "node-1", 3, "join", at(40*time.Minute)),
		}
		mustJoin(t, s, reclaim)
		revoked := func(c store.Cert) store.Cert {
			c.RevokedAt, c.RevokedReason = at(30*time.Minute), "compromised"
			return c
		}
		all := []store.Cert{reclaim.Cert, revoked(r2), revoked(r1), revoked(j.Cert)}
		norm := func(cs []store.Cert) []store.Cert {
			out := []store.Cert{}
			for _, c := range cs {
				out = append(out, normCert(c))
			}
			return out
		}
		for _, q := range []struct {
			node  string
			limit int
			want  []store.Cert
		}{
			{"node-1", 100, all},
			{"node-1", 4, all},
			{"node-1", 2, all[:2]},
			{"node-1", 1, all[:1]},
			{"node-9", 10, nil},
		} {
			got, err := s.ListCerts(ctx, q.node, q.limit)
			if err != nil {
				t.Fatalf("ListCerts(%s, %d): %v", q.node, q.limit, err)
			}
			wantEqual(t, fmt.Sprintf("ListCerts(%s, %d)", q.node, q.limit), norm, got, q.want)
		}
		if _, err := s.ListCerts(ctx, "node-1", 0); err == nil {
			t.Errorf("ListCerts with limit 0 succeeded; want an error")
		}
	}},
	{"renewal times are the renew certificates' issue times from a time on, oldest first", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		mustJoin(t, s, newJoin("", "node-2", "t1", at(0)))
		// Recorded out of time order, so that insertion order is not the
		// answer.
		for _, r := range []struct {
			serial string
			issued time.Duration
		}{{"s4", 30 * time.Minute}, {"s2", 10 * time.Minute}, {"s3", 20 * time.Minute}} {
			if err := s.RecordRenewal(ctx, newCert(r.serial, "node-1", 1, "renew", at(r.issued)), nil); err != nil {
				t.Fatalf("RecordRenewal(%s): %v", r.serial, err)
			}
		}
		if err := s.RecordRenewal(ctx, newCert("t2", "node-2", 1, "renew", at(15*time.Minute)), nil); err != nil {
			t.Fatalf("RecordRenewal(t2): %v", err)
		}
		// A reclaim's join certificate is not a renewal.
		reclaim := store.Join{
			Now:     at(40 * time.Minute),
			Node:    newNode("node-1", 2, "s5", at(40*time.Minute)),
			Reclaim: true,
			Cert:    newCert("s5", "node-1", 2, "join", at(40*time.Minute)),
		}
		mustJoin(t, s, reclaim)
		// Renewals revoked by the reclaim still count: they were issued.
		// node-1 has a join certificate at 0 and 40 minutes and renewals at
		// 10, 20 and 30.
		m := func(minutes ...int) []time.Time {
			ts := []time.Time{}
			for _, n := range minutes {
				ts = append(ts, at(time.Duration(n)*time.Minute))
			}
			return ts
		}
		for _, q := range []struct {
			node  string
			since time.Time
			want  []time.Time
		}{
			{"node-1", time.Time{}, m(10, 20, 30)},
			{"node-1", at(0), m(10, 20, 30)},
			{"node-1", at(10 * time.Minute), m(10, 20, 30)},
			{"node-1", at(10*time.Minute + time.Microsecond), m(20, 30)},
			{"node-1", at(30 * time.Minute), m(30)},
			{"node-1", at(31 * time.Minute), m()},
			{"node-2", time.Time{}, m(15)},
			{"node-9", time.Time{}, m()},
		} {
			ts, err := s.RenewalTimes(ctx, q.node, q.since)
			if err != nil {
				t.Fatalf("RenewalTimes(%s, %v): %v", q.node, q.since, err)
			}
			if !slices.EqualFunc(ts, q.want, time.Time.Equal) {
				t.Errorf("RenewalTimes(%s, %v) = %v, want %v", q.node, q.since, ts, q.want)
			}
		}
	}},
}

var revokeCases = []testCase{
	{"revoking a node raises its generation and revokes its certificates", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		mustJoin(t, s, newJoin("", "node-2", "t1", at(0)))
		if err := s.RecordRenewal(ctx, newCert("s2", "node-1", 1, "renew", at(10*time.Minute)), nil); err != nil {
			t.Fatalf("RecordRenewal: %v", err)
		}
		gen, serials, err := s.RevokeNode(ctx, "node-1", "compromised", at(time.Hour), nil)
		if err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		if gen != 2 {
			t.Errorf("RevokeNode generation = %d, want 2", gen)
		}
		wantSerials(t, "RevokeNode", serials, "s1", "s2")
		n := mustGetNode(t, s, "node-1")
		if n.Generation != 2 || n.State != store.StateRevoked {
			t.Errorf("revoked node: generation %d, state %q; want 2, %q", n.Generation, n.State, store.StateRevoked)
		}
		for _, serial := range []string{"s1", "s2"} {
			if c := mustGetCert(t, s, serial); !c.RevokedAt.Equal(at(time.Hour)) || c.RevokedReason != "compromised" {
				t.Errorf("certificate %s: RevokedAt %v, reason %q; want %v, compromised", serial, c.RevokedAt, c.RevokedReason, at(time.Hour))
			}
		}
		if c := mustGetCert(t, s, "t1"); !c.RevokedAt.IsZero() {
			t.Errorf("another node's certificate was revoked: %+v", c)
		}
		if n := mustGetNode(t, s, "node-2"); n.Generation != 1 || n.State != store.StateActive {
			t.Errorf("another node changed: %+v", n)
		}

		// A second revocation raises the generation again and revokes
		// nothing new; the first revocation's record stays.
		gen, serials, err = s.RevokeNode(ctx, "node-1", "again", at(2*time.Hour), nil)
		if err != nil {
			t.Fatalf("second RevokeNode: %v", err)
		}
		if gen != 3 {
			t.Errorf("second RevokeNode generation = %d, want 3", gen)
		}
		wantSerials(t, "second RevokeNode", serials)
		if c := mustGetCert(t, s, "s1"); !c.RevokedAt.Equal(at(time.Hour)) || c.RevokedReason != "compromised" {
			t.Errorf("the second revocation rewrote s1: %+v", c)
		}
	}},
	{"revoking an unknown node is not found", func(t *testing.T, s store.Store) {
		_, _, err := s.RevokeNode(t.Context(), "node-1", "test", at(0), nil)
		wantErr(t, "RevokeNode(unknown)", err, store.ErrNotFound)
	}},
	{"deleting a node keeps its certificate records revoked", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		mustJoin(t, s, newJoin("", "node-2", "t1", at(0)))
		if err := s.RecordRenewal(ctx, newCert("s2", "node-1", 1, "renew", at(10*time.Minute)), nil); err != nil {
			t.Fatalf("RecordRenewal: %v", err)
		}
		gen, serials, err := s.DeleteNode(ctx, "node-1", "decommissioned", at(time.Hour), nil)
		if err != nil {
			t.Fatalf("DeleteNode: %v", err)
		}
		if gen != 2 {
			t.Errorf("DeleteNode returned generation %d; want 2, the one it revoked at", gen)
		}
		wantSerials(t, "DeleteNode", serials, "s1", "s2")
		wantNoNode(t, s, "node-1")
		for _, serial := range []string{"s1", "s2"} {
			c := mustGetCert(t, s, serial)
			if c.NodeID != "node-1" || !c.RevokedAt.Equal(at(time.Hour)) || c.RevokedReason != "decommissioned" {
				t.Errorf("certificate %s after deletion: %+v", serial, c)
			}
		}
		ns, err := s.ListNodes(ctx)
		if err != nil {
			t.Fatalf("ListNodes: %v", err)
		}
		wantIDs(t, "ListNodes after deletion", ns, "node-2")
		found, err := s.NodesByClaims(ctx, "uuid-node-1", []string{"board-node-1"})
		if err != nil {
			t.Fatalf("NodesByClaims: %v", err)
		}
		wantIDs(t, "nodes with the deleted node's claims", found)
		if n, err := s.CountCerts(ctx, "node-1", time.Time{}); err != nil || n != 2 {
			t.Errorf("CountCerts of the deleted node = %d, %v; want 2", n, err)
		}
		err = s.RecordRenewal(ctx, newCert("s3", "node-1", 1, "renew", at(2*time.Hour)), nil)
		wantErr(t, "renewal of the deleted node", err, store.ErrConflict)

		// The id is free again: the machine may join anew.
		j := newJoin("", "node-1", "s9", at(3*time.Hour))
		j.Node.Generation, j.Cert.Generation = 5, 5
		mustJoin(t, s, j)
		wantEqual(t, "node joined after deletion", normNode, mustGetNode(t, s, "node-1"), j.Node)
		if c := mustGetCert(t, s, "s1"); c.RevokedReason != "decommissioned" {
			t.Errorf("the new join changed an old certificate: %+v", c)
		}
	}},
	{"a revocation and a deletion append their audit events in their transactions", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		mustJoin(t, s, newJoin("", "node-2", "t1", at(0)))
		rev := newAudit("node.revoke", "node-1", at(time.Hour))
		if _, _, err := s.RevokeNode(ctx, "node-1", "compromised", at(time.Hour), rev); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		del := newAudit("node.delete", "node-2", at(2*time.Hour))
		if _, _, err := s.DeleteNode(ctx, "node-2", "decommissioned", at(2*time.Hour), del); err != nil {
			t.Fatalf("DeleteNode: %v", err)
		}
		wantAudit(t, "audit trail after the revocation and the deletion", s, del, rev)

		_, _, err := s.RevokeNode(ctx, "node-9", "test", at(3*time.Hour), newAudit("node.revoke", "node-9", at(3*time.Hour)))
		wantErr(t, "RevokeNode(unknown)", err, store.ErrNotFound)
		_, _, err = s.DeleteNode(ctx, "node-2", "test", at(3*time.Hour), newAudit("node.delete", "node-2", at(3*time.Hour)))
		wantErr(t, "DeleteNode(deleted)", err, store.ErrNotFound)
		if _, _, err := s.RevokeNode(ctx, "node-1", "again", at(4*time.Hour), nil); err != nil {
			t.Fatalf("RevokeNode without an event: %v", err)
		}
		wantAudit(t, "audit trail after the refused calls and one without an event", s, del, rev)
	}},
	{"deleting an unknown node is not found", func(t *testing.T, s store.Store) {
		_, _, err := s.DeleteNode(t.Context(), "node-1", "test", at(0), nil)
		wantErr(t, "DeleteNode(unknown)", err, store.ErrNotFound)
	}},
}
