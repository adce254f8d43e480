package service

import (
	"context"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// watchRevocations ends the live sessions this replica holds of nodes that
// another replica revoked (DESIGN.md §3: a revocation reaches every
// replica's live sessions), when the store is shared (store.RevocationFeed).
// It runs until ctx ends. The store reconnects by itself and catches up on
// what it missed.
func (s *Server) watchRevocations(ctx context.Context) {
	feed, ok := s.cfg.Store.(store.RevocationFeed)
	if !ok {
		return
	}
	if reg, ok := s.sessionRegistry(); ok {
		reg.HandleSessionMessages(func(m store.SessionMessage) { s.onSessionMessage(ctx, reg, m) })
	}
	_ = feed.WatchRevocations(ctx, func(r store.Revocation) {
		s.publishRevocation(ctx, r.NodeID, true)
		notice := &gatewayv1.RevocationNotice{Reason: r.Reason, IdentityGeneration: r.Generation}
		if s.sessions.notifyOlder(r.NodeID, r.Generation, notice) {
			s.log.InfoContext(ctx, "session ended by a revocation from another replica", logkey.NodeID, r.NodeID, logkey.Generation, r.Generation, logkey.Reason, r.Reason)
		}
	}, func(err error) {
		if err != nil {
			s.log.WarnContext(ctx, "revocation feed lost; reconnecting, then catching up", logkey.Error, err)
			return
		}
		s.log.InfoContext(ctx, "revocation feed back; caught up")
	})
}

// Clone detection across replicas. A node's live session is recorded in
// the shared store (store.SessionRegistry) with the replica that holds it.
// When a session opens and the record names another replica and another
// process instance, this replica asks that one, over the store's
// notifications, to probe the node on the older session: an answer within
// ProbeTimeout means one certificate is live in two places (cloned); no
// answer (the session, or the replica, is gone) means the new session
// takes over. A reconnect of the same instance only tells the other replica
// to end the session it may still hold.

// sessionRegistry returns the store's registry of live sessions, when
// several replicas share it.
func (s *Server) sessionRegistry() (store.SessionRegistry, bool) {
	reg, ok := s.cfg.Store.(store.SessionRegistry)
	return reg, ok
}

// claimAcrossReplicas records sess as its node's live session and settles
// with the replica that held the node's previous one. It returns the
// clone's revocation notice (and the new generation) when the previous
// session still answers.
func (s *Server) claimAcrossReplicas(ctx context.Context, sess *session) (*gatewayv1.RevocationNotice, error) {
	reg, ok := s.sessionRegistry()
	if !ok {
		return nil, nil
	}
	me := store.LiveSession{NodeID: sess.nodeID, Instance: sess.instance, Replica: s.replica}
	prev, found, err := reg.ClaimSession(ctx, me)
	if err != nil {
		return nil, unavailable("session", "the session could not be recorded; reconnect", err, logkey.NodeID, sess.nodeID)
	}
	if !found || prev.Replica == s.replica {
		return nil, nil // none, or this replica's own (settled in memory)
	}
	tell := func(kind, id string) {
		_ = reg.SendSessionMessage(context.WithoutCancel(ctx), store.SessionMessage{
			Kind: kind, ID: id, NodeID: sess.nodeID, Instance: prev.Instance, From: s.replica, To: prev.Replica})
	}
	if prev.Instance == sess.instance {
		tell(store.SessionReplaced, "")
		return nil, nil
	}
	if !s.probeRemote(ctx, prev, tell) {
		tell(store.SessionReplaced, "")
		s.log.InfoContext(ctx, "session replaced one on another replica that no longer answers", logkey.NodeID, sess.nodeID)
		return nil, nil
	}
	reason := fmt.Sprintf("certificate looks cloned: two live sessions at once (instances %s and %s)", capClaim(prev.Instance), capClaim(sess.instance))
	gen := s.revokeCloned(ctx, sess.nodeID, reason)
	return &gatewayv1.RevocationNotice{Reason: reason, IdentityGeneration: gen}, nil
}

// releaseAcrossReplicas forgets sess in the shared record when it ends.
func (s *Server) releaseAcrossReplicas(ctx context.Context, sess *session) {
	reg, ok := s.sessionRegistry()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// A failure leaves a record a later probe finds gone.
	_ = reg.ReleaseSession(ctx, store.LiveSession{NodeID: sess.nodeID, Instance: sess.instance, Replica: s.replica})
}

// probeRemote asks prev's replica to probe its session and reports whether
// the node answered there within ProbeTimeout.
func (s *Server) probeRemote(ctx context.Context, prev store.LiveSession, tell func(kind, id string)) bool {
	id := randomHex(12)
	answer := make(chan string, 1)
	s.probeMu.Lock()
	s.probes[id] = answer
	s.probeMu.Unlock()
	defer func() {
		s.probeMu.Lock()
		delete(s.probes, id)
		s.probeMu.Unlock()
	}()
	tell(store.SessionProbe, id)
	t := time.NewTimer(s.cfg.ProbeTimeout)
	defer t.Stop()
	select {
	case kind := <-answer:
		return kind == store.SessionAlive
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// onSessionMessage handles a message of another replica about a session.
func (s *Server) onSessionMessage(ctx context.Context, reg store.SessionRegistry, m store.SessionMessage) {
	if m.To != s.replica {
		return
	}
	switch m.Kind {
	case store.SessionProbe:
		go func() {
			kind := store.SessionGone
			if sess := s.sessions.get(m.NodeID); sess != nil && sess.instance == m.Instance && sess.alive(s.cfg.ProbeTimeout*2/3) {
				kind = store.SessionAlive
			}
			_ = reg.SendSessionMessage(ctx, store.SessionMessage{Kind: kind, ID: m.ID, NodeID: m.NodeID, Instance: m.Instance, From: s.replica, To: m.From})
		}()
	case store.SessionAlive, store.SessionGone:
		s.probeMu.Lock()
		answer := s.probes[m.ID]
		s.probeMu.Unlock()
		if answer != nil {
			select {
			case answer <- m.Kind:
			default:
			}
		}
	case store.SessionReplaced:
		if s.sessions.drop(m.NodeID, m.Instance) {
			s.log.InfoContext(ctx, "session taken over on another replica", logkey.NodeID, m.NodeID)
		}
	}
}
