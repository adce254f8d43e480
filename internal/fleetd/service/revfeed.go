package service

import (
	"context"
	"sync"
	"time"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// The revocation feed tells node daemons which certificates of other nodes
// were revoked, so that a daemon refuses the machine proofs made with them
// (callsig.ProofCache.RevokeCert): without it, a revoked certificate that
// has not expired passes a daemon's verification, which checks no
// revocation. See docs/callsig.md, "Revocations reach the daemons".
//
// Only sessions that ask for it (RevocationFeedRequest) get it, so a fleet
// whose daemons take no calls from other machines pays nothing. A
// subscriber gets the catch-up first: the revoked certificates not yet
// expired, from the store, bounded by revFeedCatchUpMax. Then each new
// revocation (made here, or on another replica and heard from the store's
// feed) is queued on every subscriber, up to revFeedQueueMax certificates,
// and a drain goroutine per subscriber, alive only while its queue is not
// empty, writes it to the session (the session has no goroutine of its
// own); a subscriber that falls further behind has its queue dropped and
// gets a catch-up again instead, so a slow session never holds up a
// revocation or grows memory. Catch-ups read within revFeedCatchUpTTL of each other share one
// store read when no revocation came between (a fleet reconnecting after a
// restart costs one read, not one per node).

const (
	// revFeedCatchUpMax bounds a catch-up: with node ids of at most 63
	// bytes and serials of 20, 3072 certificates encode in well under
	// 512 KiB, the session's frame limit.
	revFeedCatchUpMax = 3072
	// revFeedQueueMax bounds the certificates queued on one subscriber.
	revFeedQueueMax = 256
	// revFeedCatchUpTTL is how long a catch-up read serves others.
	revFeedCatchUpTTL = 10 * time.Second
	// revFeedRetry is how long a subscriber waits to retry a catch-up
	// whose store read failed.
	revFeedRetry = 5 * time.Second
	// revFeedNodeCerts bounds the certificates read of one revoked node.
	revFeedNodeCerts = 64
)

// Why a subscriber gets a catch-up: the reason label of
// nodetrust_revocation_feed_catchups_total. A catch-up that had to be
// retried (its store read failed) keeps the reason it was owed for.
const (
	// catchUpSubscribe: the session subscribed (or subscribed again).
	catchUpSubscribe = "subscribe"
	// catchUpFellBehind: its queue would have passed revFeedQueueMax.
	catchUpFellBehind = "fell_behind"
	// catchUpReadFailed: a revocation's certificates could not be read
	// (publishRevocation), so no subscriber could be told them.
	catchUpReadFailed = "read_failed"
	// catchUpWriteFailed: a write to the session failed, so what it
	// carried may not have arrived (the session is ending; the catch-up
	// is sent only if it is still there).
	catchUpWriteFailed = "write_failed"
)

// revFeed is the registry of subscribed sessions.
type revFeed struct {
	// drain sends what a subscriber holds, on a goroutine of its own
	// that runs only while there is something to send (Server's
	// drainRevocations; nil in tests of the queues alone).
	drain func(*revSub)

	mu   sync.Mutex
	subs map[*session]*revSub
	// published counts the revocations fanned out; a catch-up read that
	// started at count n holds every revocation published before.
	published uint64
	cached    *revCatchUp
}

// revCatchUp is a catch-up read that started when published was count.
type revCatchUp struct {
	count uint64
	at    time.Time
	msg   *gatewayv1.RevokedCerts
}

// revSub is one subscribed session's queue. A drain goroutine, started
// when the queue gets something and none runs, sends it to the session, so
// that a session that writes slowly holds up only itself.
type revSub struct {
	sess    *session
	mu      sync.Mutex
	pending []*gatewayv1.RevokedCert
	// behind says why the next send is a catch-up (one of the catchUp
	// reasons), or is empty when it is not: the queue overflowed, a
	// revocation's certificates could not be read, or a catch-up owed
	// could not be read or written.
	behind string
	// draining is set while a drain goroutine runs.
	draining bool
}

func newRevFeed() *revFeed { return &revFeed{subs: map[*session]*revSub{}} }

// kick starts sub's drain goroutine when sub holds something and none
// runs.
func (f *revFeed) kick(sub *revSub) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	f.kickLocked(sub)
}

// kickLocked is kick with sub.mu held.
func (f *revFeed) kickLocked(sub *revSub) {
	if sub.draining || f.drain == nil || (sub.behind == "" && len(sub.pending) == 0) || sub.ended() {
		return
	}
	sub.draining = true
	go f.drain(sub)
}

// ended reports whether sub's session has ended (a retry then stops).
func (sub *revSub) ended() bool {
	select {
	case <-sub.sess.done:
		return true
	default:
		return false
	}
}

// drainRevocations sends what sub holds until it holds nothing, or the
// session's transport fails (the session then ends, and unsubscribes).
func (s *Server) drainRevocations(sub *revSub) {
	for {
		resp, reason := s.revocationsDue(sub)
		if resp == nil {
			return
		}
		s.metrics.revocationsSent(resp.GetRevokedCerts(), reason)
		if err := sub.sess.send(resp); err != nil {
			// What was taken is not lost: a session whose transport
			// failed ends (its transport closes on a failed write);
			// until then the subscriber owes a catch-up.
			sub.mu.Lock()
			sub.draining, sub.behind = false, catchUpWriteFailed
			sub.mu.Unlock()
			return
		}
	}
}

// subscribeRevocations subscribes sess to the feed (once; again means a new
// catch-up) and sends the catch-up answering request id. It runs on the
// session's reader; the session's end unsubscribes it (gateway.close). An
// error means the answer could not be written.
func (s *Server) subscribeRevocations(ctx context.Context, sess *session, id uint64) error {
	f := s.revfeed
	f.mu.Lock()
	sub := f.subs[sess]
	if sub == nil {
		sub = &revSub{sess: sess}
		f.subs[sess] = sub
	}
	// The queue empties into the catch-up at count snap, under f.mu so
	// that no publication falls between.
	snap := f.published
	sub.mu.Lock()
	sub.pending, sub.behind = nil, ""
	sub.mu.Unlock()
	f.mu.Unlock()
	msg, err := s.revocationCatchUp(ctx, snap)
	if err != nil {
		sub.mu.Lock()
		sub.behind = catchUpSubscribe
		sub.mu.Unlock()
		time.AfterFunc(revFeedRetry, func() { f.kick(sub) })
		return sess.send(&gatewayv1.SessionResponse{Id: id, Body: &gatewayv1.SessionResponse_Error{Error: s.sessionError(ctx, err, logkey.NodeID, sess.nodeID)}})
	}
	s.metrics.revocationsSent(msg, catchUpSubscribe)
	return sess.send(&gatewayv1.SessionResponse{Id: id, Body: &gatewayv1.SessionResponse_RevokedCerts{RevokedCerts: msg}})
}

func (f *revFeed) unsubscribe(sess *session) {
	f.mu.Lock()
	delete(f.subs, sess)
	f.mu.Unlock()
}

// subscribers is how many sessions are subscribed.
func (f *revFeed) subscribers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subs)
}

// revocationsDue returns what sub holds to send (id 0), or nil, and then
// its drain goroutine ends; for a catch-up, also why it is owed. It runs
// on that goroutine.
func (s *Server) revocationsDue(sub *revSub) (_ *gatewayv1.SessionResponse, catchUpReason string) {
	ctx, sess := sub.sess.ctx, sub.sess
	f := s.revfeed
	f.mu.Lock()
	snap := f.published
	sub.mu.Lock()
	behind, pending := sub.behind, sub.pending
	sub.pending, sub.behind = nil, ""
	if behind == "" && len(pending) == 0 {
		sub.draining = false
	}
	sub.mu.Unlock()
	f.mu.Unlock()
	if behind == "" {
		if len(pending) == 0 {
			return nil, ""
		}
		return &gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_RevokedCerts{RevokedCerts: &gatewayv1.RevokedCerts{Certs: pending}}}, ""
	}
	msg, err := s.revocationCatchUp(ctx, snap)
	if err != nil {
		s.log.WarnContext(ctx, "revocation feed: catch-up failed; retrying", logkey.NodeID, sess.nodeID, logkey.Error, err)
		sub.mu.Lock()
		// A reason that came meanwhile is as good: the catch-up
		// owed is one.
		if sub.behind == "" {
			sub.behind = behind
		}
		sub.draining = false
		sub.mu.Unlock()
		time.AfterFunc(revFeedRetry, func() { f.kick(sub) })
		return nil, ""
	}
	return &gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_RevokedCerts{RevokedCerts: msg}}, behind
}

// revocationCatchUp returns the revoked certificates not yet expired, from
// a read that holds every revocation published before count snap: the
// cached one when it does and is fresh, else a new read.
func (s *Server) revocationCatchUp(ctx context.Context, snap uint64) (*gatewayv1.RevokedCerts, error) {
	f := s.revfeed
	now := s.cfg.Now()
	f.mu.Lock()
	c := f.cached
	start := f.published
	f.mu.Unlock()
	if c != nil && c.count >= snap && now.Sub(c.at) < revFeedCatchUpTTL && !now.Before(c.at) {
		return c.msg, nil
	}
	certs, err := s.cfg.Store.RevokedCerts(ctx, now, revFeedCatchUpMax+1)
	if err != nil {
		return nil, unavailable("revocation feed", "the revoked certificates could not be read; subscribe again", err)
	}
	msg := &gatewayv1.RevokedCerts{CatchUp: true}
	if len(certs) > revFeedCatchUpMax {
		certs, msg.Truncated = certs[:revFeedCatchUpMax], true
		s.log.WarnContext(ctx, "revocation feed: catch-up cut at its bound", "bound", revFeedCatchUpMax)
	}
	msg.Certs = revokedCerts(certs)
	f.mu.Lock()
	if f.cached == nil || start >= f.cached.count {
		f.cached = &revCatchUp{count: start, at: now, msg: msg}
	}
	f.mu.Unlock()
	return msg, nil
}

func revokedCerts(certs []store.Cert) []*gatewayv1.RevokedCert {
	out := make([]*gatewayv1.RevokedCert, len(certs))
	for i, c := range certs {
		out[i] = &gatewayv1.RevokedCert{NodeId: c.NodeID, Serial: c.Serial, NotAfterUnixNano: c.NotAfter.UnixNano()}
	}
	return out
}

// publishRevocation sends the revoked, unexpired certificates of node
// nodeID to every subscriber. fromFeed says the revocation was heard from
// the store's feed (store.RevocationFeed): with such a store every
// revocation, this replica's own included, arrives that way, and the
// local call is skipped so that subscribers hear each once.
func (s *Server) publishRevocation(ctx context.Context, nodeID string, fromFeed bool) {
	if _, shared := s.cfg.Store.(store.RevocationFeed); shared && !fromFeed {
		return
	}
	f := s.revfeed
	f.mu.Lock()
	none := len(f.subs) == 0
	if none {
		// Counted all the same: a cached catch-up read before this
		// revocation must not serve a later subscriber.
		f.published++
	}
	f.mu.Unlock()
	if none {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	now := s.cfg.Now()
	all, err := s.cfg.Store.ListCerts(ctx, nodeID, revFeedNodeCerts)
	var certs []store.Cert
	for _, c := range all {
		if !c.RevokedAt.IsZero() && c.NotAfter.After(now) {
			certs = append(certs, c)
		}
	}
	if err != nil {
		// Without the serials, every subscriber catches up from the
		// store instead.
		s.log.WarnContext(ctx, "revocation feed: the revoked certificates could not be read; subscribers catch up", logkey.NodeID, nodeID, logkey.Error, err)
	}
	f.fanOut(revokedCerts(certs), err != nil)
}

// fanOut queues certs on every subscriber, or marks them behind when
// failed (the certificates are unknown) or when their queue would pass
// revFeedQueueMax, and starts their drains. It never waits on a session.
func (f *revFeed) fanOut(certs []*gatewayv1.RevokedCert, failed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.published++
	if !failed && len(certs) == 0 {
		return
	}
	for _, sub := range f.subs {
		sub.mu.Lock()
		switch {
		case sub.behind != "":
		case failed:
			sub.pending, sub.behind = nil, catchUpReadFailed
		case len(sub.pending)+len(certs) > revFeedQueueMax:
			sub.pending, sub.behind = nil, catchUpFellBehind
		default:
			sub.pending = append(sub.pending, certs...)
		}
		f.kickLocked(sub)
		sub.mu.Unlock()
	}
}
