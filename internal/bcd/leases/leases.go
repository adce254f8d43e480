package leases

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nodetrust/nodetrust/localapi"
)

// Time-to-live bounds of a lease.
const (
	DefaultTTL = 60 * time.Second
	MaxTTL     = time.Hour
	// MaxWaiting is the most goals that may wait for one resource.
	MaxWaiting = 64
)

// Errors of the table's operations; the returned errors wrap them with the
// details.
var (
	ErrUnknownResource = errors.New("unknown resource")
	ErrUnknownGoal     = errors.New("unknown goal")
	// ErrNotSender: only the sender of a goal may renew, release or
	// cancel it.
	ErrNotSender = errors.New("not the goal's sender")
	// ErrDuplicate: the sender already has a live goal on the resource.
	ErrDuplicate = errors.New("duplicate goal")
	// ErrNotGranted: the goal still waits, so there is no lease to renew
	// or release.
	ErrNotGranted = errors.New("goal not granted")
	ErrBadTTL     = errors.New("bad time to live")
	ErrBusy       = errors.New("too many goals wait")
)

type goal struct {
	id       string
	resource string
	sender   localapi.Principal
	state    string
	ttl      time.Duration
	expires  time.Time
}

func (g *goal) view() localapi.Goal {
	v := localapi.Goal{GoalID: g.id, Resource: g.resource, Sender: g.sender, State: g.state}
	if g.state == localapi.GoalGranted {
		t := g.expires.UTC()
		v.ExpiresAt = &t
	}
	return v
}

type resource struct {
	holder  *goal
	waiting []*goal
}

// Table holds the leases of a node's resources.
type Table struct {
	now   func() time.Time
	names []string

	mu    sync.Mutex
	res   map[string]*resource
	goals map[string]*goal // live goals: waiting or granted
}

// New returns a table leasing resources, with clock now (nil means
// time.Now). Each resource name must be unique and non-empty.
func New(resources []string, now func() time.Time) (*Table, error) {
	if now == nil {
		now = time.Now
	}
	t := &Table{now: now, res: map[string]*resource{}, goals: map[string]*goal{}}
	for _, r := range resources {
		if r == "" {
			return nil, errors.New("new lease table: a resource name is empty")
		}
		if _, dup := t.res[r]; dup {
			return nil, fmt.Errorf("new lease table: resource %q is listed twice", r)
		}
		t.res[r] = &resource{}
		t.names = append(t.names, r)
	}
	return t, nil
}

// Resources returns the names of the resources, in the order given to New.
func (t *Table) Resources() []string { return slices.Clone(t.names) }

func ttlOf(ttl time.Duration) (time.Duration, error) {
	switch {
	case ttl == 0:
		return DefaultTTL, nil
	case ttl < time.Second || ttl > MaxTTL:
		return 0, fmt.Errorf("%w: %v; want 1s to %v (or 0 for %v)", ErrBadTTL, ttl, MaxTTL, DefaultTTL)
	}
	return ttl, nil
}

// Acquire starts a goal of sender to hold resource for ttl (0 means
// DefaultTTL). The goal is granted at once when the resource is free, else
// it waits.
func (t *Table) Acquire(sender localapi.Principal, name string, ttl time.Duration) (localapi.Goal, error) {
	ttl, err := ttlOf(ttl)
	if err != nil {
		return localapi.Goal{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.expire(now)
	r, ok := t.res[name]
	if !ok {
		return localapi.Goal{}, fmt.Errorf("%w %q: this node leases %q", ErrUnknownResource, name, t.names)
	}
	for _, g := range append([]*goal{r.holder}, r.waiting...) {
		if g != nil && g.sender == sender {
			return localapi.Goal{}, fmt.Errorf("%w: %s already has goal %s on %q (%s); renew, release or cancel it", ErrDuplicate, sender, g.id, name, g.state)
		}
	}
	if r.holder != nil && len(r.waiting) >= MaxWaiting {
		return localapi.Goal{}, fmt.Errorf("%w: %d goals wait for %q; try again later", ErrBusy, len(r.waiting), name)
	}
	g := &goal{id: newGoalID(), resource: name, sender: sender, state: localapi.GoalWaiting, ttl: ttl}
	t.goals[g.id] = g
	if r.holder == nil {
		t.grant(r, g, now)
	} else {
		r.waiting = append(r.waiting, g)
	}
	return g.view(), nil
}

// Renew extends the granted lease of goal id to ttl from now.
func (t *Table) Renew(sender localapi.Principal, id string, ttl time.Duration) (localapi.Goal, error) {
	ttl, err := ttlOf(ttl)
	if err != nil {
		return localapi.Goal{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	g, err := t.own(sender, id, now)
	if err != nil {
		return localapi.Goal{}, err
	}
	if g.state != localapi.GoalGranted {
		return localapi.Goal{}, fmt.Errorf("%w: goal %s waits for %q; renew it once it is granted", ErrNotGranted, id, g.resource)
	}
	g.ttl, g.expires = ttl, now.Add(ttl)
	return g.view(), nil
}

// Release ends the granted lease of goal id, and grants the resource to
// the first goal waiting for it.
func (t *Table) Release(sender localapi.Principal, id string) (localapi.Goal, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	g, err := t.own(sender, id, now)
	if err != nil {
		return localapi.Goal{}, err
	}
	if g.state != localapi.GoalGranted {
		return localapi.Goal{}, fmt.Errorf("%w: goal %s waits for %q; cancel it instead", ErrNotGranted, id, g.resource)
	}
	t.end(g, localapi.GoalReleased, now)
	return g.view(), nil
}

// Cancel ends goal id, waiting or granted. Only its sender may cancel it.
func (t *Table) Cancel(sender localapi.Principal, id string) (localapi.Goal, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	g, err := t.own(sender, id, now)
	if err != nil {
		return localapi.Goal{}, err
	}
	t.end(g, localapi.GoalCancelled, now)
	return g.view(), nil
}

// Forget cancels every live goal of sender, such as the goals of an
// instance whose process ended, and returns them.
func (t *Table) Forget(sender localapi.Principal) []localapi.Goal {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.expire(now)
	var ended []localapi.Goal
	for _, name := range t.names {
		r := t.res[name]
		for _, g := range append([]*goal{r.holder}, r.waiting...) {
			if g != nil && g.sender == sender {
				t.end(g, localapi.GoalCancelled, now)
				ended = append(ended, g.view())
			}
		}
	}
	return ended
}

// List returns every resource with its holder and waiting goals.
func (t *Table) List() localapi.Leases {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(t.now())
	out := localapi.Leases{Resources: []localapi.ResourceLeases{}}
	for _, name := range t.names {
		r := t.res[name]
		rl := localapi.ResourceLeases{Resource: name, Waiting: []localapi.Goal{}}
		if r.holder != nil {
			h := r.holder.view()
			rl.Holder = &h
		}
		for _, g := range r.waiting {
			rl.Waiting = append(rl.Waiting, g.view())
		}
		out.Resources = append(out.Resources, rl)
	}
	return out
}

// own returns live goal id after checking that sender sent it.
func (t *Table) own(sender localapi.Principal, id string, now time.Time) (*goal, error) {
	t.expire(now)
	g, ok := t.goals[id]
	if !ok {
		return nil, fmt.Errorf("%w %q: it was released, cancelled or expired, or never made", ErrUnknownGoal, id)
	}
	if g.sender != sender {
		return nil, fmt.Errorf("%w: goal %s was sent by %s, not by %s; only its sender can end it", ErrNotSender, id, g.sender, sender)
	}
	return g, nil
}

// grant gives r to g from at.
func (t *Table) grant(r *resource, g *goal, at time.Time) {
	r.holder = g
	g.state, g.expires = localapi.GoalGranted, at.Add(g.ttl)
}

// end ends live goal g in state at time at, and hands its resource on.
func (t *Table) end(g *goal, state string, at time.Time) {
	r := t.res[g.resource]
	delete(t.goals, g.id)
	if r.holder == g {
		g.state = state
		r.holder = nil
		t.next(r, at)
		return
	}
	g.state = state
	r.waiting = slices.DeleteFunc(r.waiting, func(w *goal) bool { return w == g })
}

// next grants r to its first waiting goal, from at.
func (t *Table) next(r *resource, at time.Time) {
	if len(r.waiting) == 0 {
		return
	}
	g := r.waiting[0]
	r.waiting = r.waiting[1:]
	t.grant(r, g, at)
}

// expire ends the leases that expired by now, each at its own expiry, so
// that a goal granted after an expiry starts then.
func (t *Table) expire(now time.Time) {
	for _, r := range t.res {
		for r.holder != nil && now.After(r.holder.expires) {
			t.end(r.holder, localapi.GoalExpired, r.holder.expires)
		}
	}
}

func newGoalID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "g-" + hex.EncodeToString(b)
}
