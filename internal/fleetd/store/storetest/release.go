package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// newRelease returns a ready release of uuid for node-1, made at made and
// expiring an hour later.
func newRelease(uuid string, made time.Time) store.ConfigRelease {
	return store.ConfigRelease{UUID: uuid, NodeID: "node-1", Verifier: bytes.Repeat([]byte{1}, 32), Sealed: []byte("sealed config"),
		ContentType: "application/yaml", CreatedAt: made, ExpiresAt: made.Add(time.Hour)}
}

func mustPutRelease(t *testing.T, s store.Store, r store.ConfigRelease) store.ConfigRelease {
	t.Helper()
	got, err := s.PutConfigRelease(t.Context(), r, nil)
	if err != nil {
		t.Fatalf("PutConfigRelease(%s): %v", r.UUID, err)
	}
	return got
}

func mustGetRelease(t *testing.T, s store.Store, uuid string) store.ConfigRelease {
	t.Helper()
	r, err := s.GetConfigRelease(t.Context(), uuid)
	if err != nil {
		t.Fatalf("GetConfigRelease(%s): %v", uuid, err)
	}
	return r
}

var releaseCases = []testCase{
	{"a config release is stored whole, and a new render replaces it at the next generation", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		if _, err := s.GetConfigRelease(ctx, "uuid-a"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetConfigRelease(unknown): %v, want ErrNotFound", err)
		}
		r := newRelease("uuid-a", at(0))
		audit := newAudit("config.render", "node-1", at(0))
		got, err := s.PutConfigRelease(ctx, r, audit)
		if err != nil {
			t.Fatal(err)
		}
		wantAudit(t, "after a render", s, audit)
		want := r
		want.Generation, want.State = 1, store.ReleaseReady
		for _, g := range []store.ConfigRelease{got, mustGetRelease(t, s, "uuid-a")} {
			wantEqual(t, "stored release", normRelease, g, want)
		}
		if err := s.ClaimConfigRelease(ctx, "uuid-a", 1, "fetch-1", at(time.Minute), at(2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		r2 := newRelease("uuid-a", at(time.Minute))
		r2.Verifier, r2.Sealed = bytes.Repeat([]byte{2}, 32), []byte("second render")
		got = mustPutRelease(t, s, r2)
		want = r2
		want.Generation, want.State = 2, store.ReleaseReady
		wantEqual(t, "re-rendered release", normRelease, got, want)
		// The earlier generation's claim is gone with it.
		wantErr(t, "burn with the replaced generation's claim", s.BurnConfigRelease(ctx, "uuid-a", 1, "fetch-1", at(time.Minute)), store.ErrConflict)
		wantErr(t, "claim of the replaced generation", s.ClaimConfigRelease(ctx, "uuid-a", 1, "fetch-2", at(time.Minute), at(2*time.Minute)), store.ErrConflict)
		wantErr(t, "claim of an unknown uuid", s.ClaimConfigRelease(ctx, "uuid-b", 1, "fetch-2", at(time.Minute), at(2*time.Minute)), store.ErrNotFound)
	}},
	{"a claim is exclusive until it lapses, and a burn needs the claim", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustPutRelease(t, s, newRelease("uuid-a", at(0)))
		if err := s.ClaimConfigRelease(ctx, "uuid-a", 1, "fetch-1", at(time.Minute), at(2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		got := mustGetRelease(t, s, "uuid-a")
		if got.State != store.ReleaseClaimed || got.ClaimID != "fetch-1" || !got.ClaimedUntil.Equal(at(2*time.Minute)) {
			t.Fatalf("claimed release %+v", got)
		}
		wantErr(t, "a second claim while the first holds", s.ClaimConfigRelease(ctx, "uuid-a", 1, "fetch-2", at(90*time.Second), at(3*time.Minute)), store.ErrConflict)
		wantErr(t, "unclaim by another fetch", s.UnclaimConfigRelease(ctx, "uuid-a", 1, "fetch-2"), store.ErrConflict)
		// Released: ready again, and another fetch claims it.
		if err := s.UnclaimConfigRelease(ctx, "uuid-a", 1, "fetch-1"); err != nil {
			t.Fatal(err)
		}
		if got := mustGetRelease(t, s, "uuid-a"); got.State != store.ReleaseReady || got.ClaimID != "" || !got.ClaimedUntil.IsZero() {
			t.Fatalf("unclaimed release %+v", got)
		}
		if err := s.ClaimConfigRelease(ctx, "uuid-a", 1, "fetch-2", at(time.Minute), at(2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		// A lapsed claim (the fetch's process died) gives way exactly at
		// its end.
		if err := s.ClaimConfigRelease(ctx, "uuid-a", 1, "fetch-3", at(2*time.Minute), at(3*time.Minute)); err != nil {
			t.Fatalf("claim once the earlier lapsed: %v", err)
		}
		wantErr(t, "burn by the lapsed claim", s.BurnConfigRelease(ctx, "uuid-a", 1, "fetch-2", at(2*time.Minute)), store.ErrConflict)
		if err := s.BurnConfigRelease(ctx, "uuid-a", 1, "fetch-3", at(150*time.Second)); err != nil {
			t.Fatal(err)
		}
		got = mustGetRelease(t, s, "uuid-a")
		if got.State != store.ReleaseBurned || got.Sealed != nil || got.ClaimID != "" || !got.BurnedAt.Equal(at(150*time.Second)) || got.Activation != "" {
			t.Fatalf("burned release %+v", got)
		}
		wantErr(t, "claim of a burned release", s.ClaimConfigRelease(ctx, "uuid-a", 1, "fetch-4", at(3*time.Minute), at(4*time.Minute)), store.ErrConflict)
		wantErr(t, "unclaim of a burned release", s.UnclaimConfigRelease(ctx, "uuid-a", 1, "fetch-3"), store.ErrConflict)
	}},
	{"an expired release is not claimed and its sealed config is purged", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustPutRelease(t, s, newRelease("uuid-a", at(0)))
		mustPutRelease(t, s, newRelease("uuid-b", at(time.Hour)))
		wantErr(t, "claim at the expiry", s.ClaimConfigRelease(ctx, "uuid-a", 1, "fetch-1", at(time.Hour), at(time.Hour+time.Minute)), store.ErrConflict)
		n, err := s.PurgeExpiredReleases(ctx, at(time.Hour))
		if err != nil || n != 1 {
			t.Fatalf("PurgeExpiredReleases: %d, %v; want 1", n, err)
		}
		if got := mustGetRelease(t, s, "uuid-a"); got.Sealed != nil || got.Generation != 1 || len(got.Verifier) == 0 {
			t.Fatalf("purged release %+v: want the row without its sealed config", got)
		}
		if got := mustGetRelease(t, s, "uuid-b"); string(got.Sealed) != "sealed config" {
			t.Fatalf("unexpired release %+v lost its config", got)
		}
		if n, err := s.PurgeExpiredReleases(ctx, at(time.Hour)); err != nil || n != 0 {
			t.Fatalf("second purge: %d, %v; want 0", n, err)
		}
	}},
	{"of concurrent claims of one release exactly one wins", func(t *testing.T, s store.Store) {
		mustPutRelease(t, s, newRelease("uuid-a", at(0)))
		const n = 16
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = s.ClaimConfigRelease(t.Context(), "uuid-a", 1, fmt.Sprintf("fetch-%d", i), at(time.Minute), at(2*time.Minute))
			})
		}
		close(start)
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, store.ErrConflict):
				t.Errorf("claim %d: %v, want nil or ErrConflict", i, err)
			}
		}
		if won != 1 {
			t.Fatalf("%d claims won, want exactly 1", won)
		}
	}},
	{"a burned release's activation is listed until settled, failures counted", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		for i, uuid := range []string{"uuid-b", "uuid-a", "uuid-c"} {
			mustPutRelease(t, s, newRelease(uuid, at(0)))
			if err := s.ClaimConfigRelease(ctx, uuid, 1, "f", at(time.Minute), at(2*time.Minute)); err != nil {
				t.Fatal(err)
			}
			if uuid == "uuid-c" {
				continue // claimed, never burned
			}
			if err := s.BurnConfigRelease(ctx, uuid, 1, "f", at(time.Duration(i+1)*time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.ListUnsettledReleases(ctx, 0); err == nil {
			t.Error("ListUnsettledReleases(0): no error")
		}
		list := func() []string {
			t.Helper()
			rs, err := s.ListUnsettledReleases(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, r := range rs {
				out = append(out, fmt.Sprintf("%s/%d", r.UUID, r.ActivationAttempts))
			}
			return out
		}
		if got := fmt.Sprint(list()); got != "[uuid-b/0 uuid-a/0]" {
			t.Fatalf("unsettled %s, want uuid-b then uuid-a", got)
		}
		if err := s.FailActivation(ctx, "uuid-b", 1, "store down"); err != nil {
			t.Fatal(err)
		}
		wantErr(t, "fail of another generation", s.FailActivation(ctx, "uuid-b", 2, "x"), store.ErrConflict)
		wantErr(t, "fail of an unburned release", s.FailActivation(ctx, "uuid-c", 1, "x"), store.ErrConflict)
		if got := fmt.Sprint(list()); got != "[uuid-b/1 uuid-a/0]" {
			t.Fatalf("after a failure: %s", got)
		}
		if r := mustGetRelease(t, s, "uuid-b"); r.ActivationError != "store down" {
			t.Fatalf("failure not recorded: %+v", r)
		}
		if err := s.SettleActivation(ctx, "uuid-b", 1, "active", at(time.Hour)); err != nil {
			t.Fatal(err)
		}
		wantErr(t, "settle twice", s.SettleActivation(ctx, "uuid-b", 1, "active", at(time.Hour)), store.ErrConflict)
		if got := fmt.Sprint(list()); got != "[uuid-a/0]" {
			t.Fatalf("after settling uuid-b: %s", got)
		}
		if r := mustGetRelease(t, s, "uuid-b"); r.Activation != "active" || !r.ActivatedAt.Equal(at(time.Hour)) {
			t.Fatalf("settled release %+v", r)
		}
		// A new render starts over: nothing of the old activation is left
		// to settle.
		mustPutRelease(t, s, newRelease("uuid-a", at(time.Hour)))
		if got := list(); len(got) != 0 {
			t.Fatalf("after re-rendering uuid-a: unsettled %v", got)
		}
	}},
}

func normRelease(r store.ConfigRelease) store.ConfigRelease {
	r.CreatedAt, r.ExpiresAt, r.ClaimedUntil, r.BurnedAt, r.ActivatedAt = normTime(r.CreatedAt), normTime(r.ExpiresAt), normTime(r.ClaimedUntil), normTime(r.BurnedAt), normTime(r.ActivatedAt)
	if len(r.Sealed) == 0 {
		r.Sealed = nil
	}
	return r
}
