package storetest

import (
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var auditCases = []testCase{
	{"an empty audit trail lists nothing", func(t *testing.T, s store.Store) {
		es, err := s.ListAudit(t.Context(), 10)
		if err != nil || len(es) != 0 {
			t.Errorf("ListAudit on an empty store = %v, %v; want none", es, err)
		}
	}},
	{"audit events list newest first up to the limit", func(t *testing.T, s store.Store) {
		ev := func(minute int, action string) store.AuditEvent {
			return store.AuditEvent{
				Time:    at(time.Duration(minute) * time.Minute),
				Actor:   "admin@example.org",
				Action:  action,
				Subject: "node-1",
				Detail:  "detail of " + action,
			}
		}
		// Appended out of time order: "newest" is by Time. e3 and e4 share a
		// time, so the one appended later is the newer.
		appended := []store.AuditEvent{ev(1, "e1"), ev(5, "e5"), ev(2, "e2"), ev(3, "e3"), ev(3, "e4")}
		for _, e := range appended {
			if err := s.AppendAudit(t.Context(), e); err != nil {
				t.Fatalf("AppendAudit(%s): %v", e.Action, err)
			}
		}
		newestFirst := []store.AuditEvent{appended[1], appended[4], appended[3], appended[2], appended[0]}
		for _, limit := range []int{1, 3, 5, 100} {
			es, err := s.ListAudit(t.Context(), limit)
			if err != nil {
				t.Fatalf("ListAudit(%d): %v", limit, err)
			}
			want := newestFirst[:min(limit, len(newestFirst))]
			if len(es) != len(want) {
				t.Errorf("ListAudit(%d) returned %d events, want %d", limit, len(es), len(want))
				continue
			}
			for i := range es {
				wantEqual(t, "event", normAudit, es[i], want[i])
			}
		}
	}},
	{"an audit limit below one is refused", func(t *testing.T, s store.Store) {
		for _, limit := range []int{0, -1} {
			if _, err := s.ListAudit(t.Context(), limit); err == nil {
				t.Errorf("ListAudit(%d) succeeded", limit)
			}
		}
	}},
}
