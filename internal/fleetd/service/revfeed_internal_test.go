package service

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
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
		want := ""
		if i >= revFeedQueueMax {
			want = catchUpFellBehind
		}
		if behind != want {
			t.Fatalf("after %d revocations the slow subscriber is behind for %q, want %q", i+1, behind, want)
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
	if fast.behind != catchUpReadFailed || len(fast.pending) != 0 {
		t.Errorf("after a failed read: behind for %q with %d queued, want a catch-up for %q", fast.behind, len(fast.pending), catchUpReadFailed)
	}
	slow.mu.Lock()
	defer slow.mu.Unlock()
	if slow.behind != catchUpFellBehind {
		t.Errorf("after a failed read the slow subscriber is behind for %q, want still %q (the catch-up owed first)", slow.behind, catchUpFellBehind)
	}
	if f.published != revFeedQueueMax+2 {
		t.Errorf("published = %d, want %d", f.published, revFeedQueueMax+2)
	}
}

// TestRevFeedMetrics: the feed's metrics count the subscribed sessions,
// each catch-up by why it was owed, the catch-ups cut at their bound, and
// the certificates pushed. A session's writes are held by the test, so a
// queue can overflow behind one.
func TestRevFeedMetrics(t *testing.T) {
	s := testServer(t, Config{RenewalLimit: 10000})
	ctx := t.Context()
	// Each write is reported on sent and returns what the test puts on
	// result, so the drain goroutine waits for the test at each.
	sent := make(chan *gatewayv1.SessionResponse, 1)
	result := make(chan error, 1)
	sess := newSession("web", "proc")
	sess.s, sess.ctx = s, ctx
	// Each drain goroutine says when it ended.
	drainEnded := make(chan struct{}, 64)
	s.revfeed.drain = func(sub *revSub) {
		s.drainRevocations(sub)
		drainEnded <- struct{}{}
	}
	sess.send = func(m *gatewayv1.SessionResponse) error {
		sent <- m
		return <-result
	}
	next := func(what string, err error) *gatewayv1.RevokedCerts {
		t.Helper()
		select {
		case m := <-sent:
			result <- err
			if m.GetRevokedCerts() == nil {
				t.Fatalf("%s: wrote %v, want revoked certificates", what, m)
			}
			return m.GetRevokedCerts()
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: nothing written", what)
			return nil
		}
	}
	catchUps := func(reason string) float64 { return testutil.ToFloat64(s.metrics.feedCatchUps.WithLabelValues(reason)) }
	want := func(what string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	certs := func(n int) []*gatewayv1.RevokedCert {
		out := make([]*gatewayv1.RevokedCert, n)
		for i := range out {
			out[i] = &gatewayv1.RevokedCert{NodeId: "n", Serial: fmt.Sprintf("%x", i)}
		}
		return out
	}

	want("subscribers before any", testutil.ToFloat64(s.metrics.feedSubscribers), 0)
	subscribed := make(chan error, 1)
	go func() { subscribed <- s.subscribeRevocations(ctx, sess, 1) }()
	if rc := next("the subscription's catch-up", nil); !rc.CatchUp {
		t.Fatalf("answer to the subscription %v, want a catch-up", rc)
	}
	if err := <-subscribed; err != nil {
		t.Fatal(err)
	}
	want("subscribers", testutil.ToFloat64(s.metrics.feedSubscribers), 1)
	want("catch-ups for subscribe", catchUps(catchUpSubscribe), 1)

	// A push of one certificate; while its write is held, 257 more
	// overflow the queue, and the next write is a catch-up.
	s.revfeed.fanOut(certs(1), false)
	select {
	case m := <-sent:
		if rc := m.GetRevokedCerts(); rc.CatchUp || len(rc.Certs) != 1 {
			t.Fatalf("wrote %v, want a push of one certificate", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the push was not written")
	}
	s.revfeed.fanOut(certs(revFeedQueueMax), false)
	s.revfeed.fanOut(certs(1), false)
	result <- nil
	if rc := next("after the overflow", nil); !rc.CatchUp {
		t.Fatalf("wrote %v after the overflow, want a catch-up", rc)
	}
	want("certificates pushed", testutil.ToFloat64(s.metrics.feedPushed), 1)
	want("catch-ups for fell_behind", catchUps(catchUpFellBehind), 1)

	// A revocation whose certificates could not be read.
	s.revfeed.fanOut(nil, true)
	if rc := next("after a failed read", nil); !rc.CatchUp {
		t.Fatalf("wrote %v after a failed read, want a catch-up", rc)
	}
	want("catch-ups for read_failed", catchUps(catchUpReadFailed), 1)

	// A write that fails: the next revocation brings a catch-up instead.
	s.revfeed.fanOut(certs(2), false)
	next("a push whose write fails", errors.New("connection reset"))
	s.revfeed.mu.Lock()
	sub := s.revfeed.subs[sess]
	s.revfeed.mu.Unlock()
	for owed := ""; owed != catchUpWriteFailed; {
		select {
		case <-drainEnded:
		case <-time.After(10 * time.Second):
			t.Fatal("the drain whose write failed did not end")
		}
		sub.mu.Lock()
		owed = sub.behind
		sub.mu.Unlock()
	}
	s.revfeed.fanOut(certs(3), false)
	if rc := next("after the failed write", nil); !rc.CatchUp {
		t.Fatalf("wrote %v after a failed write, want a catch-up", rc)
	}
	want("catch-ups for write_failed", catchUps(catchUpWriteFailed), 1)
	want("certificates pushed", testutil.ToFloat64(s.metrics.feedPushed), 3)
	want("truncated catch-ups", testutil.ToFloat64(s.metrics.feedTruncated), 0)

	// One more revoked unexpired certificate than a catch-up holds: a
	// node renewed that often, then revoked.
	n := joinNodes(t, s, 1)[0].caller.node
	now := s.cfg.Now()
	for i := range revFeedCatchUpMax {
		c := store.Cert{Serial: fmt.Sprintf("f%039x", i), NodeID: n.ID, Generation: n.Generation, Kind: "renew", IssuedAt: now, NotAfter: now.Add(time.Hour)}
		if err := s.cfg.Store.RecordRenewal(ctx, c, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.cfg.Store.RevokeNode(ctx, n.ID, "lost", now, nil); err != nil {
		t.Fatal(err)
	}
	go s.publishRevocation(ctx, n.ID, false)
	if rc := next("the revocation's push", nil); rc.CatchUp || len(rc.Certs) != revFeedNodeCerts {
		t.Fatalf("pushed %d certificates (catch-up %v), want the node's %d", len(rc.Certs), rc.CatchUp, revFeedNodeCerts)
	}
	want("certificates pushed", testutil.ToFloat64(s.metrics.feedPushed), 3+revFeedNodeCerts)
	go func() { subscribed <- s.subscribeRevocations(ctx, sess, 2) }()
	if rc := next("a second subscription's catch-up", nil); !rc.CatchUp || !rc.Truncated || len(rc.Certs) != revFeedCatchUpMax {
		t.Fatalf("catch-up of %d certificates (truncated %v), want %d, truncated", len(rc.Certs), rc.Truncated, revFeedCatchUpMax)
	}
	if err := <-subscribed; err != nil {
		t.Fatal(err)
	}
	want("truncated catch-ups", testutil.ToFloat64(s.metrics.feedTruncated), 1)
	want("catch-ups for subscribe", catchUps(catchUpSubscribe), 2)
	want("subscribers after subscribing again", testutil.ToFloat64(s.metrics.feedSubscribers), 1)

	s.revfeed.unsubscribe(sess)
	want("subscribers after the session ended", testutil.ToFloat64(s.metrics.feedSubscribers), 0)
}
