package throttle

import (
	"errors"
	"sort"
	"sync"
	"time"
)

// Config configures a Limiter.
type Config struct {
	// Window is how long a key's budget lasts.
	Window time.Duration
	// Burst is how many events of one key pass in a window.
	Burst int
	// MaxKeys bounds the keys remembered (default 65536).
	MaxKeys int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Limiter counts events by key. It is safe for concurrent use.
type Limiter struct {
	cfg Config

	mu      sync.Mutex
	entries map[key]*entry
	dropped map[string]*Dropped
}

type key struct{ group, sub string }

type entry struct {
	start  time.Time
	passed int
	// held counts the events held back since the last that passed.
	held uint64
	// inSummary is set once the key's drops count in the next TakeDropped.
	inSummary bool
}

// Dropped is what a group lost since the last TakeDropped.
type Dropped struct {
	Group string
	// Events held back, and how many keys of the group they came from.
	Events uint64
	Keys   int
}

// overflowSub is the sub-key new keys share once MaxKeys are remembered.
const overflowSub = "\x00overflow"

// New makes a Limiter; Window and Burst must be positive.
func New(cfg Config) (*Limiter, error) {
	if cfg.Window <= 0 || cfg.Burst <= 0 {
		return nil, errors.New("throttle: Window and Burst must be positive")
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 65536
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Limiter{cfg: cfg, entries: map[key]*entry{}, dropped: map[string]*Dropped{}}, nil
}

// Allow reports whether an event of (group, sub) may pass. When it may,
// heldBack is the number of the key's events held back since the last one
// that passed, for the caller to mention.
func (l *Limiter) Allow(group, sub string) (ok bool, heldBack uint64) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := key{group, sub}
	e := l.entries[k]
	if e == nil {
		if len(l.entries) >= l.cfg.MaxKeys {
			l.pruneLocked(now)
		}
		if len(l.entries) >= l.cfg.MaxKeys {
			k.sub = overflowSub
			e = l.entries[k]
		}
		if e == nil {
			e = &entry{start: now}
			l.entries[k] = e
		}
	}
	if now.Sub(e.start) >= l.cfg.Window {
		e.start, e.passed = now, 0
	}
	if e.passed < l.cfg.Burst {
		e.passed++
		heldBack, e.held = e.held, 0
		return true, heldBack
	}
	e.held++
	d := l.dropped[group]
	if d == nil {
		d = &Dropped{Group: group}
		l.dropped[group] = d
	}
	d.Events++
	if !e.inSummary {
		e.inSummary = true
		d.Keys++
	}
	return false, 0
}

// pruneLocked forgets the keys whose window is over. Their held-back
// counts stay in the summary but no longer reach a later Allow.
func (l *Limiter) pruneLocked(now time.Time) {
	for k, e := range l.entries {
		if now.Sub(e.start) >= l.cfg.Window {
			delete(l.entries, k)
		}
	}
}

// TakeDropped returns what each group lost since the last call, sorted by
// group, and starts counting afresh.
func (l *Limiter) TakeDropped() []Dropped {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Dropped, 0, len(l.dropped))
	for _, d := range l.dropped {
		out = append(out, *d)
	}
	clear(l.dropped)
	for _, e := range l.entries {
		e.inSummary = false
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

// Len is the number of keys remembered.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}
