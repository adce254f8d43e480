package storetest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

func newIntakeSession(id string, created, expires time.Time) store.IntakeSession {
	return store.IntakeSession{
		ID: id, Device: "dev-" + id, EKPin: "sha256:" + id,
		EKPublic: []byte("ek of " + id), AKName: []byte("ak name of " + id), AKPublic: []byte("ak of " + id),
		LDevIDSerial: "1" + fmt.Sprint(len(id)), LAKSerial: "2" + fmt.Sprint(len(id)),
		CreatedAt: created, ExpiresAt: expires, BootVerdict: store.IntakeBootPass,
	}
}

func sameIntakeSession(a, b store.IntakeSession) bool {
	return a.ID == b.ID && a.Device == b.Device && a.EKPin == b.EKPin &&
		bytes.Equal(a.EKPublic, b.EKPublic) && bytes.Equal(a.AKName, b.AKName) && bytes.Equal(a.AKPublic, b.AKPublic) &&
		a.LDevIDSerial == b.LDevIDSerial && a.LAKSerial == b.LAKSerial &&
		a.CreatedAt.Equal(b.CreatedAt) && a.ExpiresAt.Equal(b.ExpiresAt) && a.BootVerdict == b.BootVerdict
}

var intakeCases = []testCase{
	{"an intake session is read back whole, more than once", func(t *testing.T, s store.Store) {
		want := newIntakeSession("in1", at(0), at(time.Hour))
		if err := s.PutIntakeSession(t.Context(), want, at(0), 10); err != nil {
			t.Fatalf("PutIntakeSession: %v", err)
		}
		for range 2 {
			got, err := s.GetIntakeSession(t.Context(), "in1")
			if err != nil || !sameIntakeSession(got, want) {
				t.Fatalf("GetIntakeSession = %+v, %v; want %+v", got, err, want)
			}
		}
	}},
	{"an unknown intake session is not found", func(t *testing.T, s store.Store) {
		_, err := s.GetIntakeSession(t.Context(), "nope")
		wantErr(t, "GetIntakeSession(unknown)", err, store.ErrNotFound)
	}},
	{"an intake session whose id exists is a conflict", func(t *testing.T, s store.Store) {
		first := newIntakeSession("in1", at(0), at(time.Hour))
		if err := s.PutIntakeSession(t.Context(), first, at(0), 10); err != nil {
			t.Fatal(err)
		}
		dup := first
		dup.Device = "other"
		wantErr(t, "PutIntakeSession(same id)", s.PutIntakeSession(t.Context(), dup, at(0), 10), store.ErrConflict)
		if got, err := s.GetIntakeSession(t.Context(), "in1"); err != nil || got.Device != first.Device {
			t.Errorf("GetIntakeSession = %+v, %v; want the first", got, err)
		}
	}},
	{"expired intake sessions are removed by a later put and do not count", func(t *testing.T, s store.Store) {
		for i, id := range []string{"a", "b"} {
			if err := s.PutIntakeSession(t.Context(), newIntakeSession(id, at(0), at(time.Duration(i+1)*time.Minute)), at(0), 2); err != nil {
				t.Fatal(err)
			}
		}
		wantErr(t, "PutIntakeSession(over max)", s.PutIntakeSession(t.Context(), newIntakeSession("c", at(0), at(time.Hour)), at(0), 2), store.ErrConflict)
		if _, err := s.GetIntakeSession(t.Context(), "c"); err == nil {
			t.Error("a session refused over the bound was stored")
		}
		// An expired session is still read until a put removes it.
		if _, err := s.GetIntakeSession(t.Context(), "a"); err != nil {
			t.Fatalf("GetIntakeSession(expired, not yet removed): %v", err)
		}
		// At exactly ExpiresAt a session has expired: "a" goes, "b" stays.
		if err := s.PutIntakeSession(t.Context(), newIntakeSession("c", at(time.Minute), at(time.Hour)), at(time.Minute), 2); err != nil {
			t.Fatalf("PutIntakeSession after one expired: %v", err)
		}
		_, err := s.GetIntakeSession(t.Context(), "a")
		wantErr(t, "GetIntakeSession(removed)", err, store.ErrNotFound)
		if _, err := s.GetIntakeSession(t.Context(), "b"); err != nil {
			t.Errorf("GetIntakeSession(b, unexpired): %v", err)
		}
	}},
}
