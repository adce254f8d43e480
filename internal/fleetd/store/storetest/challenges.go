package storetest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

func newChallenge(id string, notAfter time.Time) store.Challenge {
	return store.Challenge{ID: id, NotAfter: notAfter, State: []byte("state of " + id)}
}

func mustPutChallenge(t *testing.T, s store.Store, c store.Challenge, now time.Time) {
	t.Helper()
	if err := s.PutChallenge(t.Context(), c, now, 100); err != nil {
		t.Fatalf("PutChallenge(%s): %v", c.ID, err)
	}
}

var challengeCases = []testCase{
	{"a challenge is taken once, with its state", func(t *testing.T, s store.Store) {
		c := newChallenge("ch1", at(time.Minute))
		mustPutChallenge(t, s, c, at(0))
		got, err := s.TakeChallenge(t.Context(), "ch1")
		if err != nil {
			t.Fatalf("TakeChallenge: %v", err)
		}
		if got.ID != c.ID || !got.NotAfter.Equal(c.NotAfter) || !bytes.Equal(got.State, c.State) {
			t.Errorf("TakeChallenge = %+v, want %+v", got, c)
		}
		_, err = s.TakeChallenge(t.Context(), "ch1")
		wantErr(t, "second TakeChallenge", err, store.ErrNotFound)
	}},
	{"an unknown challenge is not found", func(t *testing.T, s store.Store) {
		_, err := s.TakeChallenge(t.Context(), "nope")
		wantErr(t, "TakeChallenge(unknown)", err, store.ErrNotFound)
	}},
	{"a challenge whose id exists is a conflict", func(t *testing.T, s store.Store) {
		mustPutChallenge(t, s, newChallenge("ch1", at(time.Minute)), at(0))
		dup := newChallenge("ch1", at(2*time.Minute))
		dup.State = []byte("other")
		wantErr(t, "PutChallenge(same id)", s.PutChallenge(t.Context(), dup, at(0), 100), store.ErrConflict)
		got, err := s.TakeChallenge(t.Context(), "ch1")
		if err != nil || string(got.State) != "state of ch1" {
			t.Errorf("TakeChallenge = %+v, %v; want the first round", got, err)
		}
	}},
	{"an expired challenge is still taken until a later put removes it", func(t *testing.T, s store.Store) {
		mustPutChallenge(t, s, newChallenge("old", at(time.Minute)), at(0))
		mustPutChallenge(t, s, newChallenge("kept", at(time.Hour)), at(0))
		if got, err := s.TakeChallenge(t.Context(), "old"); err != nil || !got.NotAfter.Equal(at(time.Minute)) {
			t.Fatalf("TakeChallenge(expired, not yet removed) = %+v, %v", got, err)
		}
		mustPutChallenge(t, s, newChallenge("old2", at(2*time.Minute)), at(0))
		// At exactly NotAfter a round has expired.
		mustPutChallenge(t, s, newChallenge("new", at(3*time.Hour)), at(2*time.Minute))
		_, err := s.TakeChallenge(t.Context(), "old2")
		wantErr(t, "TakeChallenge(removed)", err, store.ErrNotFound)
		if _, err := s.TakeChallenge(t.Context(), "kept"); err != nil {
			t.Errorf("TakeChallenge(unexpired): %v", err)
		}
	}},
	{"no more than max unexpired challenges are open", func(t *testing.T, s store.Store) {
		const max = 5
		for i := range max {
			if err := s.PutChallenge(t.Context(), newChallenge(fmt.Sprintf("ch%d", i), at(time.Duration(i+1)*time.Minute)), at(0), max); err != nil {
				t.Fatalf("PutChallenge %d: %v", i, err)
			}
		}
		wantErr(t, "PutChallenge beyond max", s.PutChallenge(t.Context(), newChallenge("over", at(time.Hour)), at(0), max), store.ErrConflict)
		_, err := s.TakeChallenge(t.Context(), "over")
		wantErr(t, "TakeChallenge(refused)", err, store.ErrNotFound)
		// Once the first has expired there is room again.
		if err := s.PutChallenge(t.Context(), newChallenge("later", at(time.Hour)), at(time.Minute), max); err != nil {
			t.Fatalf("PutChallenge after an expiry: %v", err)
		}
	}},
}
