package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// maxInstanceID bounds the instance id a node names in its Hello.
const maxInstanceID = 64

// session is one node's live stream on this server.
type session struct {
	nodeID   string
	instance string
	// generation is the node's identity generation when the session
	// opened; a revocation reported by another replica ends the session
	// only if it raised the generation above this.
	generation uint64
	// notice receives at most one revocation; the handler sends it to
	// the node and ends the stream.
	notice chan *gatewayv1.RevocationNotice
	// replaced is closed when a reconnect of the same process, or a new
	// process after this one stopped answering, takes over.
	replaced chan struct{}
	// probes asks the handler to probe the node; the handler answers on
	// the given channel when the node acknowledges.
	probes chan chan struct{}
	// checks asks the handler for a boot check now (CheckNode).
	checks chan *checkCall
	// feed is the session's subscription to the revocation feed (nil
	// until it asks; see revfeed.go).
	feed *revSub
	// done is closed when the handler returns.
	done chan struct{}
	once sync.Once
}

func newSession(nodeID, instance string) *session {
	return &session{
		nodeID:   nodeID,
		instance: instance,
		notice:   make(chan *gatewayv1.RevocationNotice, 1),
		replaced: make(chan struct{}),
		probes:   make(chan chan struct{}, 1),
		checks:   make(chan *checkCall),
		done:     make(chan struct{}),
	}
}

// alive probes the node behind s and reports whether it answered within
// timeout.
func (s *session) alive(timeout time.Duration) bool {
	ack := make(chan struct{}, 1)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case s.probes <- ack:
	case <-s.done:
		return false
	case <-t.C:
		return false
	}
	select {
	case <-ack:
		return true
	case <-s.done:
		return false
	case <-t.C:
		return false
	}
}

func (s *session) revoke(n *gatewayv1.RevocationNotice) {
	s.once.Do(func() { s.notice <- n })
}

// sessions is the registry of live sessions on this server, one per node.
type sessions struct {
	mu      sync.Mutex
	byNode  map[string]*session
	closing chan struct{} // closed by closeAll
}

func newSessions() *sessions { return &sessions{byNode: map[string]*session{}} }

// add registers sess. A session of the same node from the same process
// instance is replaced; one from another instance is returned, and
// nothing is registered: the caller decides between clone and leftover.
func (r *sessions) add(sess *session) (other *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.byNode[sess.nodeID]; ok {
		if old.instance != sess.instance {
			return old
		}
		close(old.replaced)
	}
	r.byNode[sess.nodeID] = sess
	return nil
}

// swap registers sess in place of old, which stopped answering. It fails
// when a third session got there first.
func (r *sessions) swap(old, sess *session) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur, ok := r.byNode[sess.nodeID]
	if ok && cur != old {
		return false
	}
	if ok {
		close(old.replaced)
	}
	r.byNode[sess.nodeID] = sess
	return true
}

func (r *sessions) remove(sess *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byNode[sess.nodeID] == sess {
		delete(r.byNode, sess.nodeID)
	}
}

// notify sends a revocation to the node's live session, if it has one
// here, and reports whether it did.
func (r *sessions) notify(nodeID string, n *gatewayv1.RevocationNotice) bool {
	r.mu.Lock()
	sess, ok := r.byNode[nodeID]
	if ok {
		delete(r.byNode, nodeID)
	}
	r.mu.Unlock()
	if ok {
		sess.revoke(n)
	}
	return ok
}

// notifyOlder sends a revocation that raised the node to generation gen to
// the node's live session here, if it has one of an older generation, and
// reports whether it did. A revocation heard from another replica (or
// heard twice) thus never ends the session of a node that joined again
// since.
func (r *sessions) notifyOlder(nodeID string, gen uint64, n *gatewayv1.RevocationNotice) bool {
	r.mu.Lock()
	sess, ok := r.byNode[nodeID]
	ok = ok && sess.generation < gen
	if ok {
		delete(r.byNode, nodeID)
	}
	r.mu.Unlock()
	if ok {
		sess.revoke(n)
	}
	return ok
}

// closeAll ends every session on this server (shutdown); their nodes
// reconnect, to this server when it is back or to another replica.
func (r *sessions) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing == nil {
		r.closing = make(chan struct{})
	}
	select {
	case <-r.closing:
	default:
		close(r.closing)
	}
}

// closed is closed once closeAll has run.
func (r *sessions) closed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing == nil {
		r.closing = make(chan struct{})
	}
	return r.closing
}

// get returns the node's live session here, or nil.
func (r *sessions) get(nodeID string) *session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byNode[nodeID]
}

// drop ends the node's session here if it is the one of instance (taken
// over on another replica), and reports whether it did.
func (r *sessions) drop(nodeID, instance string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	sess, ok := r.byNode[nodeID]
	if !ok || sess.instance != instance {
		return false
	}
	delete(r.byNode, nodeID)
	close(sess.replaced)
	return true
}

// count is the number of live sessions.
func (r *sessions) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byNode)
}

type gateway struct {
	gatewayv1.UnimplementedGatewayServer
	s *Server
}

// Session is a node's live stream: its renewals travel on it, and a
// revocation reaches the node through it.
func (g *gateway) Session(stream gatewayv1.Gateway_SessionServer) error {
	s := g.s
	ctx := stream.Context()
	caller, err := s.nodeFromPeer(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil || hello.InstanceId == "" || len(hello.InstanceId) > maxInstanceID {
		return refused(codes.InvalidArgument, "a session starts with Hello naming the process's instance id")
	}
	sess := newSession(caller.node.ID, hello.InstanceId)
	sess.generation = caller.node.Generation
	defer close(sess.done)
	if old := s.sessions.add(sess); old != nil {
		// Another process holds a session for this node. If it still
		// answers, one certificate is live in two places.
		if old.alive(s.cfg.ProbeTimeout) || !s.sessions.swap(old, sess) {
			reason := fmt.Sprintf("certificate looks cloned: two live sessions at once (instances %s and %s)", capClaim(old.instance), capClaim(sess.instance))
			gen := s.revokeCloned(ctx, caller.node.ID, reason)
			_ = stream.Send(&gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_Revoked{Revoked: &gatewayv1.RevocationNotice{Reason: reason, IdentityGeneration: gen}}})
			return refused(codes.Unauthenticated, "certificate revoked: %s", reason)
		}
		s.log.InfoContext(ctx, "session replaced one that no longer answers", logkey.NodeID, sess.nodeID)
	}
	defer s.sessions.remove(sess)
	if notice, err := s.claimAcrossReplicas(ctx, sess); err != nil {
		return err
	} else if notice != nil {
		_ = stream.Send(&gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_Revoked{Revoked: notice}})
		return refused(codes.Unauthenticated, "certificate revoked: %s", notice.Reason)
	}
	defer s.releaseAcrossReplicas(ctx, sess)
	s.log.InfoContext(ctx, "session opened", logkey.NodeID, sess.nodeID, logkey.Instance, capClaim(sess.instance), logkey.Peer, peerAddr(ctx))

	if err := stream.Send(&gatewayv1.SessionResponse{Id: first.Id, Body: &gatewayv1.SessionResponse_Welcome{Welcome: &gatewayv1.Welcome{
		NodeId: sess.nodeID, ServerTimeUnixNano: s.cfg.Now().UnixNano(),
	}}}); err != nil {
		return err
	}

	reqs := make(chan *gatewayv1.SessionRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	shutdown := s.sessions.closed()
	var probeAck chan struct{}
	var probeID uint64
	// book holds the nonces this session gave for boot evidence; those
	// never answered are counted when the session ends, and change nothing.
	book := &nonceBook{}
	defer func() { s.unanswered(context.WithoutCancel(ctx), sess.nodeID, ignoredSessionEnded, book.open) }()
	for {
		select {
		case call := <-sess.checks:
			bn, dropped, err := s.giveNonce(book, gatewayv1.NoncePurpose_NONCE_PURPOSE_BOOT_CHECK, call.result)
			if err != nil {
				call.result <- checkOutcome{err: err}
				continue
			}
			if dropped != nil {
				s.unanswered(ctx, sess.nodeID, ignoredReplaced, []*issuedNonce{dropped})
			}
			probeID++
			if err := stream.Send(&gatewayv1.SessionResponse{Id: probeID, Body: &gatewayv1.SessionResponse_Nonce{Nonce: bn}}); err != nil {
				return err
			}
		case <-book.expiry(time.Now()):
			s.unanswered(ctx, sess.nodeID, ignoredTimeout, book.expire(time.Now()))
		case ack := <-sess.probes:
			probeID++
			probeAck = ack
			if err := stream.Send(&gatewayv1.SessionResponse{Id: probeID, Body: &gatewayv1.SessionResponse_Probe{Probe: &gatewayv1.Ping{}}}); err != nil {
				return err
			}
		case n := <-sess.notice:
			_ = stream.Send(&gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_Revoked{Revoked: n}})
			s.log.InfoContext(ctx, "session ended by revocation", logkey.NodeID, sess.nodeID, logkey.Reason, n.Reason)
			return refused(codes.Unauthenticated, "certificate revoked: %s", n.Reason)
		case <-sess.feed.ready():
			if resp := s.revocationsDue(ctx, sess); resp != nil {
				if err := stream.Send(resp); err != nil {
					return err
				}
			}
		case <-shutdown:
			return refused(codes.Unavailable, "fleetd is shutting down; reconnect")
		case <-sess.replaced:
			return refused(codes.Aborted, "replaced by a newer session of this node (the same process reconnected, or a new one after this one stopped answering)")
		case err := <-recvErr:
			s.log.DebugContext(ctx, "session closed", logkey.NodeID, sess.nodeID, logkey.Error, err)
			return nil
		case m := <-reqs:
			if m.GetProbeAck() != nil {
				if probeAck != nil && m.Id == probeID {
					probeAck <- struct{}{}
					probeAck = nil
				}
				continue
			}
			if m.GetRevocationFeed() != nil {
				if err := stream.Send(s.subscribeRevocations(ctx, sess, m.Id)); err != nil {
					return err
				}
				continue
			}
			resp := g.handle(ctx, caller, book, m)
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

// handle answers one request on a session.
func (g *gateway) handle(ctx context.Context, caller *authedNode, book *nonceBook, m *gatewayv1.SessionRequest) *gatewayv1.SessionResponse {
	out := &gatewayv1.SessionResponse{Id: m.Id}
	switch b := m.Body.(type) {
	case *gatewayv1.SessionRequest_Ping:
		out.Body = &gatewayv1.SessionResponse_Pong{Pong: &gatewayv1.Pong{ServerTimeUnixNano: g.s.cfg.Now().UnixNano()}}
	case *gatewayv1.SessionRequest_NonceRequest:
		bn, err := g.s.nonceRequest(ctx, caller, book, b.NonceRequest)
		if err != nil {
			out.Body = &gatewayv1.SessionResponse_Error{Error: g.s.sessionError(ctx, err, logkey.NodeID, caller.node.ID)}
			break
		}
		out.Body = &gatewayv1.SessionResponse_Nonce{Nonce: bn}
	case *gatewayv1.SessionRequest_BootEvidence:
		out.Body = &gatewayv1.SessionResponse_BootResult{BootResult: g.s.bootEvidence(ctx, caller, book, b.BootEvidence)}
	case *gatewayv1.SessionRequest_AttestedRenew:
		att := &attestedRenewal{ev: b.AttestedRenew.GetEvidence()}
		if att.ev == nil {
			att.ev = &gatewayv1.BootEvidence{}
		}
		if in, ok := book.take(att.ev.Nonce, gatewayv1.NoncePurpose_NONCE_PURPOSE_RENEWAL, time.Now()); ok {
			att.nonce = in.nonce
		} else {
			g.s.boot.ignore(ignoredUnknownNonce)
		}
		renew := b.AttestedRenew.GetRenew()
		if renew == nil {
			renew = &joinv1.RenewRequest{}
		}
		signed, err := g.s.renew(ctx, caller, renew, att)
		if err != nil {
			out.Body = &gatewayv1.SessionResponse_Error{Error: g.s.sessionError(ctx, err, logkey.NodeID, caller.node.ID)}
			break
		}
		out.Body = &gatewayv1.SessionResponse_Renew{Renew: &joinv1.RenewResponse{Signed: signed}}
	case *gatewayv1.SessionRequest_Renew:
		signed, err := g.s.renew(ctx, caller, b.Renew, nil)
		if err != nil {
			out.Body = &gatewayv1.SessionResponse_Error{Error: g.s.sessionError(ctx, err, logkey.NodeID, caller.node.ID)}
			break
		}
		out.Body = &gatewayv1.SessionResponse_Renew{Renew: &joinv1.RenewResponse{Signed: signed}}
	default:
		out.Body = &gatewayv1.SessionResponse_Error{Error: g.s.sessionError(ctx, refused(codes.InvalidArgument, "unexpected message on the session"))}
	}
	return out
}

// revokeNode revokes a node's certificates in the store and ends its live
// session here with a RevocationNotice.
func (s *Server) revokeNode(ctx context.Context, nodeID, reason string, del bool) (gen uint64, serials []string, notified bool, err error) {
	now := s.cfg.Now()
	audit := &store.AuditEvent{Time: now, Actor: actorOf(ctx), Action: "node.revoke", Subject: nodeID, Detail: reason}
	if del {
		audit.Action = "node.delete"
		gen, serials, err = s.cfg.Store.DeleteNode(ctx, nodeID, reason, now, audit)
	} else {
		gen, serials, err = s.cfg.Store.RevokeNode(ctx, nodeID, reason, now, audit)
	}
	if err != nil {
		return 0, nil, false, err
	}
	notified = s.sessions.notify(nodeID, &gatewayv1.RevocationNotice{Reason: reason, IdentityGeneration: gen})
	s.publishRevocation(ctx, nodeID, false)
	cause := "revoke"
	switch {
	case del:
		cause = "delete"
	case actorOf(ctx) == "fleetd":
		cause = "clone"
	}
	s.metrics.revocation(cause)
	s.log.InfoContext(ctx, "node revoked", logkey.NodeID, nodeID, logkey.Reason, reason, "deleted", del, "certificates", len(serials), "session_notified", notified)
	return gen, serials, notified, nil
}

// revokeCloned revokes a node whose certificate looks cloned and returns
// the new generation (0 if the revocation failed, which is logged).
func (s *Server) revokeCloned(ctx context.Context, nodeID, reason string) uint64 {
	gen, _, _, err := s.revokeNode(context.WithoutCancel(ctx), nodeID, reason, false)
	if err != nil {
		s.log.ErrorContext(ctx, "revoke a cloned certificate", logkey.NodeID, nodeID, logkey.Error, err)
	}
	return gen
}

func actorOf(ctx context.Context) string {
	if n := adminName(ctx); n != "" {
		return "admin:" + n
	}
	return "fleetd"
}
