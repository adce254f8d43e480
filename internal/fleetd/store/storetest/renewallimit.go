package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// hourLimit is the suite's renewal limit: 3 renewals in any hour.
var hourLimit = store.RenewalLimit{Max: 3, Window: time.Hour}

var renewalLimitCases = []testCase{
	{"twenty concurrent renewals of one node under a limit of five, one made before: four recorded, sixteen refused with the retry time", func(t *testing.T, s store.Store) {
		RenewalLimitRace(t, s)
	}},
	{"the renewal limit slides with the window, counts only renewals, and only the node's", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s0", at(0)))
		mustJoin(t, s, newJoin("", "node-2", "t0", at(0)))
		for i, d := range []time.Duration{0, 10 * time.Minute, 20 * time.Minute} {
			c := newCert(fmt.Sprintf("s%d", i+1), "node-1", 1, "renew", at(d))
			if err := s.RecordRenewalLimited(ctx, c, hourLimit, newAudit("renew", "node-1", at(d))); err != nil {
				t.Fatalf("renewal %s under the limit: %v", c.Serial, err)
			}
		}
		// Another node's renewals and the join certificate do not count.
		if err := s.RecordRenewalLimited(ctx, newCert("t1", "node-2", 1, "renew", at(30*time.Minute)), hourLimit, nil); err != nil {
			t.Fatalf("renewal of node-2: %v", err)
		}
		refused := func(serial string, when, retry time.Time, count int) {
			t.Helper()
			err := s.RecordRenewalLimited(ctx, newCert(serial, "node-1", 1, "renew", when), hourLimit, newAudit("renew", "node-1", when))
			var le *store.RenewalLimitError
			if !errors.As(err, &le) {
				t.Fatalf("renewal %s at the limit: %v, want a *store.RenewalLimitError", serial, err)
			}
			if le.NodeID != "node-1" || le.Count != count || le.Limit != hourLimit || !le.RetryAt.Equal(retry) {
				t.Errorf("renewal %s at the limit: %+v, want node-1, %d counted, retry at %s", serial, le, count, retry)
			}
			_, err = s.GetCert(ctx, serial)
			wantErr(t, "certificate of the refused renewal "+serial, err, store.ErrNotFound)
		}
		refused("x1", at(40*time.Minute), at(time.Hour), 3)
		// At the window's end the first renewal still counts.
		refused("x2", at(time.Hour), at(time.Hour), 3)
		if err := s.RecordRenewalLimited(ctx, newCert("s4", "node-1", 1, "renew", at(time.Hour+time.Microsecond)), hourLimit, nil); err != nil {
			t.Fatalf("renewal once the first left the window: %v", err)
		}
		refused("x3", at(time.Hour+time.Minute), at(70*time.Minute), 3)
		if nd := mustGetNode(t, s, "node-1"); nd.CertSerial != "s4" {
			t.Errorf("node-1's serial is %s after the refusals, want s4", nd.CertSerial)
		}
		wantAudit(t, "audit trail", s,
			newAudit("renew", "node-1", at(20*time.Minute)),
			newAudit("renew", "node-1", at(10*time.Minute)),
			newAudit("renew", "node-1", at(0)))
		// RecordRenewal knows no limit.
		if err := s.RecordRenewal(ctx, newCert("s5", "node-1", 1, "renew", at(time.Hour+2*time.Minute)), nil); err != nil {
			t.Fatalf("RecordRenewal over the limit: %v", err)
		}
	}},
	{"a node that changed is a conflict before its renewal limit", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s0", at(0)))
		for i := range hourLimit.Max {
			if err := s.RecordRenewalLimited(ctx, newCert(fmt.Sprintf("s%d", i+1), "node-1", 1, "renew", at(time.Duration(i+1)*time.Minute)), hourLimit, nil); err != nil {
				t.Fatalf("renewal %d: %v", i+1, err)
			}
		}
		if _, _, err := s.RevokeNode(ctx, "node-1", "compromised", at(10*time.Minute), nil); err != nil {
			t.Fatalf("RevokeNode: %v", err)
		}
		err := s.RecordRenewalLimited(ctx, newCert("x", "node-1", 1, "renew", at(11*time.Minute)), hourLimit, nil)
		wantErr(t, "renewal of a revoked node at its limit", err, store.ErrConflict)
		err = s.RecordRenewalLimited(ctx, newCert("y", "node-9", 1, "renew", at(11*time.Minute)), hourLimit, nil)
		wantErr(t, "renewal of a node that does not exist", err, store.ErrConflict)
	}},
	{"a renewal limit below one, or without an issue time, is an error", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustJoin(t, s, newJoin("", "node-1", "s0", at(0)))
		for _, l := range []store.RenewalLimit{{Max: 0, Window: time.Hour}, {Max: 1, Window: 0}} {
			if err := s.RecordRenewalLimited(ctx, newCert("x", "node-1", 1, "renew", at(time.Minute)), l, nil); err == nil {
				t.Errorf("RecordRenewalLimited with limit %+v: no error", l)
			}
		}
		if err := s.RecordRenewalLimited(ctx, newCert("x", "node-1", 1, "renew", time.Time{}), hourLimit, nil); err == nil {
			t.Error("RecordRenewalLimited without an issue time: no error")
		}
		if _, err := s.GetCert(ctx, "x"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("certificate of the refused renewals: %v, want ErrNotFound", err)
		}
	}},
}

// RenewalLimitRace joins one node and renews it once, then makes twenty
// renewals of it at once under a limit of five, spread over stores (each a
// handle on the same database: several replicas), and checks that exactly
// four are recorded and each other one is refused with a
// *store.RenewalLimitError that names the retry time, writing nothing.
func RenewalLimitRace(t *testing.T, stores ...store.Store) {
	t.Helper()
	const n = 20
	limit := store.RenewalLimit{Max: 5, Window: time.Hour}
	s := stores[0]
	mustJoin(t, s, newJoin("", "node-1", "s00", at(0)))
	// One renewal before the race: the retry time is an hour after it,
	// whichever renewals of the race win.
	if err := s.RecordRenewalLimited(t.Context(), newCert("r", "node-1", 1, "renew", at(10*time.Minute)), limit, nil); err != nil {
		t.Fatalf("first renewal: %v", err)
	}
	certs := make([]store.Cert, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		certs[i] = newCert(fmt.Sprintf("r%02d", i), "node-1", 1, "renew", at(30*time.Minute))
		wg.Go(func() {
			<-start
			errs[i] = stores[i%len(stores)].RecordRenewalLimited(t.Context(), certs[i], limit, newAudit("renew", certs[i].Serial, at(30*time.Minute)))
		})
	}
	close(start)
	wg.Wait()
	var won []string
	var audit []*store.AuditEvent
	for i, err := range errs {
		if err == nil {
			won = append(won, certs[i].Serial)
			audit = append(audit, newAudit("renew", certs[i].Serial, at(30*time.Minute)))
			wantEqual(t, "certificate "+certs[i].Serial, normCert, mustGetCert(t, s, certs[i].Serial), certs[i])
			continue
		}
		var le *store.RenewalLimitError
		if !errors.As(err, &le) {
			t.Errorf("renewal %d: %v, want a *store.RenewalLimitError", i, err)
			continue
		}
		if le.Count != limit.Max || !le.RetryAt.Equal(at(70*time.Minute)) {
			t.Errorf("renewal %d refused with %+v, want %d counted and retry at %s", i, le, limit.Max, at(70*time.Minute))
		}
		_, err = s.GetCert(t.Context(), certs[i].Serial)
		wantErr(t, "certificate of the refused renewal "+certs[i].Serial, err, store.ErrNotFound)
	}
	if len(won) != limit.Max-1 {
		t.Fatalf("%d renewals of the race recorded (%v), want %d: with the one before, the limit of %d", len(won), won, limit.Max-1, limit.Max)
	}
	times, err := s.RenewalTimes(t.Context(), "node-1", time.Time{})
	if err != nil {
		t.Fatalf("RenewalTimes: %v", err)
	}
	if len(times) != limit.Max {
		t.Errorf("%d renewals stored, want %d", len(times), limit.Max)
	}
	if nd := mustGetNode(t, s, "node-1"); !slices.Contains(won, nd.CertSerial) {
		t.Errorf("node's serial %s is none of the recorded renewals %v", nd.CertSerial, won)
	}
	// Every recorded renewal has its audit event, and no refused one.
	es, err := s.ListAudit(t.Context(), 100)
	if err != nil {
		t.Fatalf("ListAudit: %v", err)
	}
	if len(es) != len(audit) {
		t.Errorf("%d audit events, want %d (one per recorded renewal)", len(es), len(audit))
	}
	for _, e := range es {
		if !slices.Contains(won, e.Subject) {
			t.Errorf("audit event of %s, which was not recorded", e.Subject)
		}
	}
}
