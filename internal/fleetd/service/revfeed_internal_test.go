package service

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
)

// TestRevFeedSlowSubscriberFallsBackToACatchUp: a subscriber that does not
// drain its queue is marked for a catch-up once the queue would pass its
// bound, and stays bounded; one that drains gets every certificate.
func TestRevFeedSlowSubscriberFallsBackToACatchUp(t *testing.T) {
	f := newRevFeed()
	// The drains only say they started; the test empties the queues.
	started := make(chan *revSub, 2*revFeedQueueMax+4)
	f.drain = func(sub *revSub) { started <- sub }
	fast, slow := &revSub{sess: &session{}}, &revSub{sess: &session{}}
	f.subs[&session{}] = fast
	f.subs[&session{}] = slow
	var got int
	for i := range revFeedQueueMax + 1 {
		f.fanOut([]*gatewayv1.RevokedCert{{NodeId: "n", Serial: fmt.Sprintf("%x", i)}}, false)
		fast.mu.Lock()
		got += len(fast.pending)
		fast.pending = nil
		fast.mu.Unlock()
		slow.mu.Lock()
		n, behind := len(slow.pending), slow.behind
		slow.mu.Unlock()
		if n > revFeedQueueMax {
			t.Fatalf("the slow subscriber holds %d certificates, over the bound %d", n, revFeedQueueMax)
		}
		if want := i >= revFeedQueueMax; behind != want {
			t.Fatalf("after %d revocations the slow subscriber is behind: %v, want %v", i+1, behind, want)
		}
	}
	// One drain per subscriber, however many revocations came while it
	// ran: each started one, and a subscriber marked draining starts no
	// other.
	seen := map[*revSub]bool{}
	for range 2 {
		select {
		case sub := <-started:
			seen[sub] = true
		case <-time.After(10 * time.Second):
			t.Fatal("a subscriber's drain did not start")
		}
	}
	if !seen[fast] || !seen[slow] || !fast.draining || !slow.draining {
		t.Errorf("drains started for fast %v, slow %v; draining %v, %v: want one each, still draining", seen[fast], seen[slow], fast.draining, slow.draining)
	}
	if got != revFeedQueueMax+1 {
		t.Errorf("the draining subscriber got %d certificates, want %d", got, revFeedQueueMax+1)
	}
	// A revocation whose certificates could not be read sends everyone to
	// a catch-up.
	f.fanOut(nil, true)
	fast.mu.Lock()
	defer fast.mu.Unlock()
	if !fast.behind || len(fast.pending) != 0 {
		t.Errorf("after a failed read: behind %v with %d queued, want a catch-up", fast.behind, len(fast.pending))
	}
	if f.published != revFeedQueueMax+2 {
		t.Errorf("published = %d, want %d", f.published, revFeedQueueMax+2)
	}
}
