package storetest

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

func verdictAt(node string, minute int, passed bool) store.Verdict {
	v := store.Verdict{
		NodeID: node, Time: at(time.Duration(minute) * time.Minute), Stage: "boot-check", Class: "worker", Passed: passed,
		Policy: "sha256:" + fmt.Sprintf("%064x", minute), NonceSHA256: fmt.Sprintf("%064x", minute+1), QuoteSHA256: fmt.Sprintf("%064x", minute+2),
	}
	if passed {
		v.Matched = "current"
	} else {
		v.Failed = []store.FailedRule{{Rule: "secure_boot", Reason: "required, but Secure Boot is off"}, {Rule: "boot_applications", Reason: "not pinned: sha256:ab"}}
	}
	return v
}

// matchedAt is a verdict of node of class at minute: passing with
// matched, or failing when matched is "".
func matchedAt(node, class string, minute int, matched string) store.Verdict {
	v := verdictAt(node, minute, matched != "")
	v.Class, v.Matched = class, matched
	return v
}

func sameVerdict(t *testing.T, got, want store.Verdict) {
	t.Helper()
	if !got.Time.Equal(want.Time) {
		t.Errorf("verdict time %v, want %v", got.Time, want.Time)
	}
	got.Time, want.Time = time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("verdict\n got %+v\nwant %+v", got, want)
	}
}

var verdictCases = []testCase{
	{"a node without verdicts lists none", func(t *testing.T, s store.Store) {
		vs, err := s.ListVerdicts(t.Context(), "node-1", 10)
		if err != nil || len(vs) != 0 {
			t.Errorf("ListVerdicts on an empty store = %v, %v; want none", vs, err)
		}
	}},
	{"verdicts list newest first, per node, with their failed rules", func(t *testing.T, s store.Store) {
		appended := []store.Verdict{verdictAt("node-1", 1, true), verdictAt("node-1", 3, false), verdictAt("node-2", 2, false), verdictAt("node-1", 2, true)}
		for _, v := range appended {
			if err := s.AppendVerdict(t.Context(), v, 10); err != nil {
				t.Fatalf("AppendVerdict: %v", err)
			}
		}
		vs, err := s.ListVerdicts(t.Context(), "node-1", 10)
		if err != nil || len(vs) != 3 {
			t.Fatalf("ListVerdicts(node-1) = %d verdicts, %v; want 3", len(vs), err)
		}
		for i, want := range []store.Verdict{appended[1], appended[3], appended[0]} {
			sameVerdict(t, vs[i], want)
		}
		vs, err = s.ListVerdicts(t.Context(), "node-1", 1)
		if err != nil || len(vs) != 1 || !vs[0].Time.Equal(appended[1].Time) {
			t.Errorf("ListVerdicts(node-1, 1) = %v, %v; want the newest alone", vs, err)
		}
		vs, err = s.ListVerdicts(t.Context(), "node-2", 10)
		if err != nil || len(vs) != 1 || len(vs[0].Failed) != 2 || vs[0].Failed[1].Rule != "boot_applications" {
			t.Errorf("ListVerdicts(node-2) = %+v, %v", vs, err)
		}
	}},
	{"a node's verdict history keeps the most recent", func(t *testing.T, s store.Store) {
		for i := range 7 {
			if err := s.AppendVerdict(t.Context(), verdictAt("node-1", i, i%2 == 0), 3); err != nil {
				t.Fatalf("AppendVerdict %d: %v", i, err)
			}
		}
		if err := s.AppendVerdict(t.Context(), verdictAt("node-2", 0, true), 3); err != nil {
			t.Fatal(err)
		}
		vs, err := s.ListVerdicts(t.Context(), "node-1", 100)
		if err != nil || len(vs) != 3 {
			t.Fatalf("after 7 appends keeping 3: %d verdicts, %v", len(vs), err)
		}
		for i, minute := range []int{6, 5, 4} {
			if !vs[i].Time.Equal(at(time.Duration(minute) * time.Minute)) {
				t.Errorf("verdict %d is of %v, want minute %d", i, vs[i].Time, minute)
			}
		}
		if vs, _ := s.ListVerdicts(t.Context(), "node-2", 100); len(vs) != 1 {
			t.Errorf("another node's history was trimmed: %d verdicts", len(vs))
		}
	}},
	{"verdict appends and lists refuse bad bounds", func(t *testing.T, s store.Store) {
		if err := s.AppendVerdict(t.Context(), verdictAt("node-1", 0, true), 0); err == nil {
			t.Error("AppendVerdict keeping 0 succeeded")
		}
		if err := s.AppendVerdict(t.Context(), verdictAt("", 0, true), 5); err == nil {
			t.Error("AppendVerdict without a node id succeeded")
		}
		if _, err := s.ListVerdicts(t.Context(), "node-1", 0); err == nil {
			t.Error("ListVerdicts(0) succeeded")
		}
	}},
	{"verdict status counts each held node's latest verdict by class and the state it matched", func(t *testing.T, s store.Store) {
		if st, err := s.CountVerdictStatus(t.Context()); err != nil || len(st) != 0 {
			t.Fatalf("CountVerdictStatus on an empty store = %v, %v; want none", st, err)
		}
		for i, id := range []string{"w-1", "w-2", "w-3", "w-4", "w-5", "c-1", "r-1"} {
			mustJoin(t, s, newJoin("", id, "s-"+id, at(time.Duration(i)*time.Minute)))
		}
		if _, _, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "r-1", From: []string{store.StateActive}, To: store.StateRetired,
			Revoke: true, Time: at(time.Hour), Actor: "admin:owner", Reason: "end of life"}); err != nil {
			t.Fatal(err)
		}
		for _, v := range []store.Verdict{
			// w-1 matched current, then next: next counts.
			matchedAt("w-1", "worker", 1, "current"), matchedAt("w-1", "worker", 5, "next"),
			// w-2 matched next, then failed: failing counts.
			matchedAt("w-2", "worker", 2, "next"), matchedAt("w-2", "worker", 6, ""),
			// w-3 failed, then matched current.
			matchedAt("w-3", "worker", 3, ""), matchedAt("w-3", "worker", 7, "current"),
			matchedAt("w-4", "worker", 4, "both"),
			// w-5 passed before Matched was recorded: current.
			matchedAt("w-5", "worker", 8, ""), {NodeID: "w-5", Time: at(9 * time.Minute), Stage: "renewal", Class: "worker", Passed: true, Failed: nil},
			matchedAt("c-1", "control-plane", 10, "next"),
			// A retired node's verdicts and a deleted node's are not counted.
			matchedAt("r-1", "worker", 11, "current"),
			matchedAt("gone-1", "worker", 12, "current"),
		} {
			if err := s.AppendVerdict(t.Context(), v, 10); err != nil {
				t.Fatalf("AppendVerdict: %v", err)
			}
		}
		st, err := s.CountVerdictStatus(t.Context())
		if err != nil || len(st) != 2 {
			t.Fatalf("CountVerdictStatus = %+v, %v; want two classes", st, err)
		}
		want := []store.VerdictStatus{
			{Class: "control-plane", Nodes: 1, Next: 1, Latest: at(10 * time.Minute)},
			{Class: "worker", Nodes: 5, Current: 2, Next: 1, Both: 1, Failing: 1, Latest: at(9 * time.Minute)},
		}
		for i := range want {
			if !st[i].Latest.Equal(want[i].Latest) {
				t.Errorf("%s: latest %v, want %v", want[i].Class, st[i].Latest, want[i].Latest)
			}
			st[i].Latest, want[i].Latest = time.Time{}, time.Time{}
			if st[i] != want[i] {
				t.Errorf("status %+v, want %+v", st[i], want[i])
			}
		}
	}},
}
