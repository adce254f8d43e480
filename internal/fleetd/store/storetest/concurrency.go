package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var concurrencyCases = []testCase{
	{"fifty concurrent joins with distinct tokens all succeed", func(t *testing.T, s store.Store) {
		const n = 50
		for i := range n {
			mustCreateToken(t, s, newToken(fmt.Sprintf("tok%02d", i), at(0)))
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				j := newJoin(fmt.Sprintf("tok%02d", i), fmt.Sprintf("node-%02d", i), fmt.Sprintf("s%02d", i), at(time.Minute))
				j.Audit = newAudit("join", j.Node.ID, at(time.Minute))
				errs[i] = s.CompleteJoin(t.Context(), j)
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("join %d: %v", i, err)
			}
		}
		es, err := s.ListAudit(t.Context(), 1000)
		if err != nil {
			t.Fatalf("ListAudit: %v", err)
		}
		subjects := map[string]int{}
		for _, e := range es {
			subjects[e.Subject]++
		}
		for i := range n {
			if id := fmt.Sprintf("node-%02d", i); subjects[id] != 1 {
				t.Errorf("%d audit events of the join of %s, want 1", subjects[id], id)
			}
		}
		if len(es) != n {
			t.Errorf("%d audit events, want %d", len(es), n)
		}
		ns, err := s.ListNodes(t.Context())
		if err != nil {
			t.Fatalf("ListNodes: %v", err)
		}
		if len(ns) != n {
			t.Errorf("ListNodes returned %d nodes, want %d", len(ns), n)
		}
		for i := range n {
			if tok := mustGetToken(t, s, fmt.Sprintf("tok%02d", i)); tok.UsedBy != fmt.Sprintf("node-%02d", i) {
				t.Errorf("token %s used by %q", tok.ID, tok.UsedBy)
			}
		}
	}},
	{"fifty joins racing for one token: exactly one wins", func(t *testing.T, s store.Store) {
		const n = 50
		mustCreateToken(t, s, newToken("tok1", at(0)))
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				j := newJoin("tok1", fmt.Sprintf("node-%02d", i), fmt.Sprintf("s%02d", i), at(time.Minute))
				j.Audit = newAudit("join", j.Node.ID, at(time.Minute))
				errs[i] = s.CompleteJoin(t.Context(), j)
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Errorf("joins %d and %d both spent the token", winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, store.ErrConflict):
				t.Errorf("losing join %d: error %v, want one wrapping %v", i, err, store.ErrConflict)
			}
		}
		if winner < 0 {
			t.Fatal("no join spent the token")
		}
		ns, err := s.ListNodes(t.Context())
		if err != nil {
			t.Fatalf("ListNodes: %v", err)
		}
		wantIDs(t, "ListNodes", ns, fmt.Sprintf("node-%02d", winner))
		if tok := mustGetToken(t, s, "tok1"); tok.UsedBy != fmt.Sprintf("node-%02d", winner) {
			t.Errorf("token used by %q, want the winner node-%02d", tok.UsedBy, winner)
		}
		wantAudit(t, "audit trail", s, newAudit("join", fmt.Sprintf("node-%02d", winner), at(time.Minute)))
	}},
	{"thirty concurrent renewals of distinct nodes, mixed with twenty joins, all succeed", func(t *testing.T, s store.Store) {
		const nr, nj = 30, 20
		before := make([]store.Node, nr)
		for i := range nr {
			j := newJoin("", fmt.Sprintf("node-%02d", i), fmt.Sprintf("s%02d", i), at(0))
			mustJoin(t, s, j)
			before[i] = j.Node
		}
		for k := range nj {
			mustCreateToken(t, s, newToken(fmt.Sprintf("tok%02d", k), at(0)))
		}
		certs := make([]store.Cert, nr)
		rerrs, jerrs := make([]error, nr), make([]error, nj)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range nr {
			certs[i] = newCert(fmt.Sprintf("r%02d", i), fmt.Sprintf("node-%02d", i), 1, "renew", at(time.Hour+time.Duration(i)*time.Second))
			wg.Go(func() {
				<-start
				rerrs[i] = s.RecordRenewal(t.Context(), certs[i], newAudit("renew", certs[i].Serial, certs[i].IssuedAt))
			})
		}
		for k := range nj {
			wg.Go(func() {
				<-start
				j := newJoin(fmt.Sprintf("tok%02d", k), fmt.Sprintf("new-%02d", k), fmt.Sprintf("n%02d", k), at(time.Minute))
				j.Audit = newAudit("join", j.Node.ID, at(time.Minute))
				jerrs[k] = s.CompleteJoin(t.Context(), j)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range rerrs {
			if err != nil {
				t.Errorf("renewal %d: %v", i, err)
			}
		}
		for k, err := range jerrs {
			if err != nil {
				t.Errorf("join %d: %v", k, err)
			}
		}
		for i, c := range certs {
			wantEqual(t, "renewed certificate", normCert, mustGetCert(t, s, c.Serial), c)
			want := before[i]
			want.CertSerial, want.CertNotAfter, want.LastSeen = c.Serial, c.NotAfter, c.IssuedAt
			wantEqual(t, "renewed node", normNode, mustGetNode(t, s, c.NodeID), want)
		}
		for k := range nj {
			if n := mustGetNode(t, s, fmt.Sprintf("new-%02d", k)); n.CertSerial != fmt.Sprintf("n%02d", k) {
				t.Errorf("joined node %s has serial %s", n.ID, n.CertSerial)
			}
		}
		es, err := s.ListAudit(t.Context(), 1000)
		if err != nil {
			t.Fatalf("ListAudit: %v", err)
		}
		if len(es) != nr+nj {
			t.Errorf("%d audit events, want %d", len(es), nr+nj)
		}
	}},
	{"twenty renewals racing for one serial: exactly one wins", func(t *testing.T, s store.Store) {
		const n = 20
		before := make([]store.Node, n)
		for i := range n {
			j := newJoin("", fmt.Sprintf("node-%02d", i), fmt.Sprintf("s%02d", i), at(0))
			mustJoin(t, s, j)
			before[i] = j.Node
		}
		certs := make([]store.Cert, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			certs[i] = newCert("race", fmt.Sprintf("node-%02d", i), 1, "renew", at(time.Hour))
			wg.Go(func() {
				<-start
				errs[i] = s.RecordRenewal(t.Context(), certs[i], newAudit("renew", certs[i].NodeID, at(time.Hour)))
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Errorf("renewals %d and %d both recorded the serial", winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, store.ErrConflict):
				t.Errorf("losing renewal %d: error %v, want one wrapping %v", i, err, store.ErrConflict)
			}
		}
		if winner < 0 {
			t.Fatal("no renewal recorded the serial")
		}
		wantEqual(t, "certificate", normCert, mustGetCert(t, s, "race"), certs[winner])
		for i := range n {
			want := before[i]
			if i == winner {
				want.CertSerial, want.CertNotAfter, want.LastSeen = "race", certs[i].NotAfter, certs[i].IssuedAt
			}
			wantEqual(t, "node", normNode, mustGetNode(t, s, before[i].ID), want)
		}
		wantAudit(t, "audit trail", s, newAudit("renew", certs[winner].NodeID, at(time.Hour)))
	}},
	{"renewals racing a revocation: those that succeed came before it and are revoked", func(t *testing.T, s store.Store) {
		const n = 20
		mustJoin(t, s, newJoin("", "node-1", "s00", at(0)))
		errs := make([]error, n)
		var (
			revErr  error
			gen     uint64
			revoked []string
		)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = s.RecordRenewal(t.Context(), newCert(fmt.Sprintf("r%02d", i), "node-1", 1, "renew", at(time.Duration(i+1)*time.Minute)), nil)
			})
			if i == n/2 {
				wg.Go(func() {
					<-start
					gen, revoked, revErr = s.RevokeNode(t.Context(), "node-1", "compromised", at(time.Hour), nil)
				})
			}
		}
		close(start)
		wg.Wait()
		if revErr != nil || gen != 2 {
			t.Fatalf("RevokeNode = %d, %v; want generation 2", gen, revErr)
		}
		want := []string{"s00"}
		for i, err := range errs {
			serial := fmt.Sprintf("r%02d", i)
			if err != nil {
				wantErr(t, "renewal "+serial, err, store.ErrConflict)
				_, err := s.GetCert(t.Context(), serial)
				wantErr(t, "certificate of the refused renewal "+serial, err, store.ErrNotFound)
				continue
			}
			want = append(want, serial)
			if c := mustGetCert(t, s, serial); c.RevokedReason != "compromised" {
				t.Errorf("certificate %s, renewed before the revocation: %+v; want it revoked", serial, c)
			}
		}
		wantSerials(t, "revoked serials", revoked, want...)
		if nd := mustGetNode(t, s, "node-1"); nd.Generation != 2 || nd.State != store.StateRevoked {
			t.Errorf("node after the revocation: generation %d, state %q", nd.Generation, nd.State)
		}
	}},
}
