package throttle

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// clock is a settable clock for the tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newLimiter(t *testing.T, burst, maxKeys int) (*Limiter, *clock) {
	t.Helper()
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	l, err := New(Config{Window: time.Minute, Burst: burst, MaxKeys: maxKeys, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	return l, c
}

func TestBurstPassesPerKeyAndWindow(t *testing.T) {
	l, c := newLimiter(t, 2, 0)
	var passed int
	for range 100 {
		if ok, _ := l.Allow("token_used", "a"); ok {
			passed++
		}
	}
	if passed != 2 {
		t.Fatalf("%d events passed in one window, want the burst of 2", passed)
	}
	if ok, _ := l.Allow("token_used", "b"); !ok {
		t.Fatal("another key's first event was held back")
	}
	if ok, _ := l.Allow("bad_csr", "a"); !ok {
		t.Fatal("another group's first event was held back")
	}
	c.add(time.Minute)
	ok, held := l.Allow("token_used", "a")
	if !ok || held != 98 {
		t.Fatalf("first event of the next window: ok %t held %d, want true and 98 held back", ok, held)
	}
}

func TestTakeDroppedSummarisesByGroup(t *testing.T) {
	l, _ := newLimiter(t, 1, 0)
	for i := range 10 {
		for range 5 {
			l.Allow("bad_csr", fmt.Sprint("src", i))
		}
	}
	l.Allow("token_used", "x")
	got := l.TakeDropped()
	if len(got) != 1 || got[0] != (Dropped{Group: "bad_csr", Events: 40, Keys: 10}) {
		t.Fatalf("dropped %+v, want 40 events of bad_csr from 10 keys", got)
	}
	if again := l.TakeDropped(); len(again) != 0 {
		t.Fatalf("a second TakeDropped returned %+v, want nothing", again)
	}
	l.Allow("bad_csr", "src0")
	if got := l.TakeDropped(); len(got) != 1 || got[0].Keys != 1 || got[0].Events != 1 {
		t.Fatalf("dropped %+v after one more, want 1 event from 1 key", got)
	}
}

func TestKeysAreBounded(t *testing.T) {
	l, c := newLimiter(t, 1, 100)
	passed := 0
	for i := range 10_000 {
		if ok, _ := l.Allow("bad_csr", fmt.Sprint("src", i)); ok {
			passed++
		}
	}
	if n := l.Len(); n > 101 {
		t.Fatalf("%d keys remembered, want at most MaxKeys and the overflow key", n)
	}
	// 100 keys and one shared overflow budget.
	if passed != 101 {
		t.Fatalf("%d events passed, want 101", passed)
	}
	c.add(time.Minute)
	if ok, _ := l.Allow("bad_csr", "new"); !ok {
		t.Fatal("after the window, expired keys were not forgotten for a new one")
	}
	if n := l.Len(); n > 2 {
		t.Fatalf("%d keys after pruning, want the new one (and at most the overflow)", n)
	}
}

func TestNewRefusesZeroWindow(t *testing.T) {
	if _, err := New(Config{Burst: 1}); err == nil {
		t.Fatal("New accepted a zero window")
	}
}

func TestConcurrentAllow(t *testing.T) {
	l, _ := newLimiter(t, 3, 16)
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				if ok, _ := l.Allow("g", fmt.Sprint(i%4)); ok {
					mu.Lock()
					passed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if passed != 12 {
		t.Fatalf("%d passed, want 3 for each of 4 keys", passed)
	}
}
