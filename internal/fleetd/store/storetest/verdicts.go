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
	if !passed {
		v.Failed = []store.FailedRule{{Rule: "secure_boot", Reason: "required, but Secure Boot is off"}, {Rule: "boot_applications", Reason: "not pinned: sha256:ab"}}
	}
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
}
