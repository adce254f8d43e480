package storetest

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

func evidenceAt(node string, minute int, log []byte) store.BootEvidence {
	pcrs := map[int][]byte{}
	for i := range 8 {
		pcrs[i] = bytes.Repeat([]byte{byte(minute + i)}, 32)
	}
	return store.BootEvidence{
		NodeID: node, Time: at(time.Duration(minute) * time.Minute), Stage: "boot-check", Class: "worker", Passed: minute%2 == 0,
		PCRs: pcrs, EventLog: log, AKPublic: []byte{0, 1, byte(minute)}, QuoteAttest: []byte{0xff, 'T', 'C', 'G', byte(minute)},
		QuoteSignature: []byte{0, 0x18, byte(minute)}, Nonce: bytes.Repeat([]byte{byte(minute)}, 32),
	}
}

func sameEvidence(t *testing.T, got, want store.BootEvidence) {
	t.Helper()
	if !got.Time.Equal(want.Time) {
		t.Errorf("evidence time %v, want %v", got.Time, want.Time)
	}
	got.Time, want.Time = time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("evidence\n got %+v\nwant %+v", got, want)
	}
}

var evidenceCases = []testCase{
	{"a node without kept evidence is ErrNotFound", func(t *testing.T, s store.Store) {
		if _, err := s.GetBootEvidence(t.Context(), "node-1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetBootEvidence on an empty store: %v, want ErrNotFound", err)
		}
	}},
	{"boot evidence is kept per node, the latest replacing the one before", func(t *testing.T, s store.Store) {
		first, second := evidenceAt("node-1", 1, []byte("log one")), evidenceAt("node-1", 2, bytes.Repeat([]byte("log two "), 1000))
		other := evidenceAt("node-2", 3, []byte("another node's log"))
		for _, e := range []store.BootEvidence{first, other, second} {
			if err := s.PutBootEvidence(t.Context(), e); err != nil {
				t.Fatalf("PutBootEvidence: %v", err)
			}
		}
		got, err := s.GetBootEvidence(t.Context(), "node-1")
		if err != nil {
			t.Fatal(err)
		}
		sameEvidence(t, got, second)
		got, err = s.GetBootEvidence(t.Context(), "node-2")
		if err != nil {
			t.Fatal(err)
		}
		sameEvidence(t, got, other)
	}},
	{"boot evidence at the log bound is kept, above it refused", func(t *testing.T, s store.Store) {
		e := evidenceAt("node-1", 1, bytes.Repeat([]byte{0xa5}, store.MaxEvidenceLogSize))
		if err := s.PutBootEvidence(t.Context(), e); err != nil {
			t.Fatalf("PutBootEvidence of a log of %d bytes: %v", store.MaxEvidenceLogSize, err)
		}
		big := evidenceAt("node-1", 2, bytes.Repeat([]byte{0x5a}, store.MaxEvidenceLogSize+1))
		if err := s.PutBootEvidence(t.Context(), big); err == nil {
			t.Error("PutBootEvidence of a log over the bound succeeded")
		}
		got, err := s.GetBootEvidence(t.Context(), "node-1")
		if err != nil || len(got.EventLog) != store.MaxEvidenceLogSize || got.EventLog[0] != 0xa5 {
			t.Errorf("after a refused put, the kept evidence has a log of %d bytes, %v; want the one before", len(got.EventLog), err)
		}
	}},
	{"boot evidence without a node id or with too many PCRs is refused", func(t *testing.T, s store.Store) {
		if err := s.PutBootEvidence(t.Context(), evidenceAt("", 1, nil)); err == nil {
			t.Error("PutBootEvidence without a node id succeeded")
		}
		e := evidenceAt("node-1", 1, nil)
		for i := range store.MaxEvidencePCRs + 1 {
			e.PCRs[i] = []byte{1}
		}
		if err := s.PutBootEvidence(t.Context(), e); err == nil {
			t.Error("PutBootEvidence with 25 PCR values succeeded")
		}
		if _, err := s.GetBootEvidence(t.Context(), "node-1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a refused put kept evidence: %v", err)
		}
	}},
	{"boot evidence without a log or quote reads back empty", func(t *testing.T, s store.Store) {
		e := store.BootEvidence{NodeID: "node-1", Time: at(0), Stage: "intake", Class: "worker", Passed: true, PCRs: map[int][]byte{0: make([]byte, 32)}}
		if err := s.PutBootEvidence(t.Context(), e); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetBootEvidence(t.Context(), "node-1")
		if err != nil || len(got.EventLog) != 0 || len(got.Nonce) != 0 || len(got.PCRs[0]) != 32 {
			t.Errorf("GetBootEvidence = %+v, %v", got, err)
		}
	}},
	{"deleting a node removes its boot evidence", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		for _, id := range []string{"node-1", "node-2"} {
			if err := s.PutBootEvidence(t.Context(), evidenceAt(id, 1, []byte("log"))); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := s.DeleteNode(t.Context(), "node-1", "gone", at(time.Hour), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetBootEvidence(t.Context(), "node-1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a deleted node's evidence: %v, want ErrNotFound", err)
		}
		if _, err := s.GetBootEvidence(t.Context(), "node-2"); err != nil {
			t.Errorf("another node's evidence after the deletion: %v", err)
		}
	}},
}
