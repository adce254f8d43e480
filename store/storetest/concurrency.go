package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/store"
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
	{"twenty joins racing for one token: exactly one wins", func(t *testing.T, s store.Store) {
		const n = 20
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
}
