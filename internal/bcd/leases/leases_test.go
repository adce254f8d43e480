package leases

import (
	"errors"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/localapi"
)

var (
	alice = localapi.Principal{NodeID: "node-a", Sender: "alice"}
	bob   = localapi.Principal{NodeID: "node-a", Sender: "bob"}
	carol = localapi.Principal{NodeID: "node-b", Sender: "alice"} // same name, other machine
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

func newTable(t *testing.T) (*Table, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	tb, err := New([]string{"gpu0", "gpu1"}, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	return tb, clk
}

func must(t *testing.T) func(localapi.Goal, error) localapi.Goal {
	return func(g localapi.Goal, err error) localapi.Goal {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
}

func TestGoalsWaitInTurnAndOnlyTheirSenderEndsThem(t *testing.T) {
	tb, clk := newTable(t)
	a := must(t)(tb.Acquire(alice, "gpu0", 10*time.Second))
	b := must(t)(tb.Acquire(bob, "gpu0", 0))
	c := must(t)(tb.Acquire(carol, "gpu0", 0))
	if a.State != localapi.GoalGranted || b.State != localapi.GoalWaiting || c.State != localapi.GoalWaiting {
		t.Fatalf("states %s %s %s", a.State, b.State, c.State)
	}
	for _, err := range []error{
		func() error { _, err := tb.Cancel(bob, a.GoalID); return err }(),
		func() error { _, err := tb.Release(carol, a.GoalID); return err }(),
		func() error { _, err := tb.Renew(bob, a.GoalID, 0); return err }(),
	} {
		if !errors.Is(err, ErrNotSender) {
			t.Errorf("another sender ended alice's goal: %v", err)
		}
	}
	if _, err := tb.Acquire(alice, "gpu0", 0); !errors.Is(err, ErrDuplicate) {
		t.Errorf("a second goal of alice on gpu0: %v", err)
	}
	if _, err := tb.Renew(bob, b.GoalID, 0); !errors.Is(err, ErrNotGranted) {
		t.Errorf("renewing a waiting goal: %v", err)
	}
	must(t)(tb.Release(alice, a.GoalID))
	l := tb.List()
	if h := l.Resources[0].Holder; h == nil || h.GoalID != b.GoalID {
		t.Fatalf("after the release gpu0 is held by %+v, want bob", h)
	}
	// Bob's lease expires unrenewed: carol gets gpu0 from its expiry.
	clk.t = clk.t.Add(DefaultTTL + time.Second)
	l = tb.List()
	if h := l.Resources[0].Holder; h == nil || h.GoalID != c.GoalID || !h.ExpiresAt.Equal(clk.t.Add(-time.Second).Add(DefaultTTL)) {
		t.Fatalf("after bob's lease expired gpu0 is held by %+v", h)
	}
	if _, err := tb.Cancel(bob, b.GoalID); !errors.Is(err, ErrUnknownGoal) {
		t.Errorf("cancel of an expired goal: %v", err)
	}
	if ended := tb.Forget(carol); len(ended) != 1 || tb.List().Resources[0].Holder != nil {
		t.Errorf("Forget(carol) ended %v", ended)
	}
}

func TestAcquireRefuses(t *testing.T) {
	tb, _ := newTable(t)
	if _, err := tb.Acquire(alice, "tpu0", 0); !errors.Is(err, ErrUnknownResource) {
		t.Errorf("unknown resource: %v", err)
	}
	if _, err := tb.Acquire(alice, "gpu0", 2*time.Hour); !errors.Is(err, ErrBadTTL) {
		t.Errorf("a ttl of 2h: %v", err)
	}
	must(t)(tb.Acquire(alice, "gpu1", 0))
	for i := 0; i < MaxWaiting; i++ {
		must(t)(tb.Acquire(localapi.Principal{NodeID: "n", Sender: string(rune('a'+i%26)) + string(rune('a'+i/26))}, "gpu1", 0))
	}
	if _, err := tb.Acquire(bob, "gpu1", 0); !errors.Is(err, ErrBusy) {
		t.Errorf("goal %d in line: %v", MaxWaiting+1, err)
	}
}
