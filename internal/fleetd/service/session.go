package service

import (
	"context"
	"errors"
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

// session is one node's live session on this server, on either transport:
// the gRPC Session stream or the framed session (api/sessionframe). It has
// no goroutine of its own: the transport's reader hands it each request
// (onRequest), and whoever has something to tell the node — a revocation,
// a probe, a boot check — writes it through send, which the transport
// makes safe for concurrent use.
type session struct {
	s        *Server
	ctx      context.Context
	caller   *authedNode
	nodeID   string
	instance string
	// generation is the node's identity generation when the session
	// opened; a revocation reported by another replica ends the session
	// only if it raised the generation above this.
	generation uint64
	// send writes one message to the node.
	send func(*gatewayv1.SessionResponse) error
	// onStop, when set, is called once by stop, and must not block: the
	// framed transport ends its connection from it. (The gRPC handler
	// waits on stopped instead.)
	onStop func(*session)
	// book holds the nonces this session gave for boot evidence.
	book *nonceBook

	mu sync.Mutex
	// serverID numbers the messages the server starts (probes, boot
	// checks); probeID is the probe awaiting an answer on probeAck.
	serverID uint64
	probeID  uint64
	probeAck chan struct{}
	// stopping is set by stop, with the error the session ends with and
	// the message sent last (nil for none).
	stopping bool
	endErr   error
	final    *gatewayv1.SessionResponse

	// stopped is closed by stop: the transport ends the session.
	stopped chan struct{}
	// done is closed when the session has ended and is cleaned up.
	done chan struct{}
}

func newSession(nodeID, instance string) *session {
	return &session{
		nodeID:   nodeID,
		instance: instance,
		book:     &nonceBook{},
		stopped:  make(chan struct{}),
		done:     make(chan struct{}),
	}
}

// stop ends the session with err, sending final first when it is not nil.
// Only the first stop counts; it never blocks, so the registry may call it
// under its lock.
func (s *session) stop(err error, final *gatewayv1.SessionResponse) bool {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return false
	}
	s.stopping, s.endErr, s.final = true, err, final
	s.mu.Unlock()
	close(s.stopped)
	if s.onStop != nil {
		s.onStop(s)
	}
	return true
}

// ending returns the error and the last message stop gave.
func (s *session) ending() (*gatewayv1.SessionResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.final, s.endErr
}

// nextServerID numbers a message the server starts.
func (s *session) nextServerID() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serverID++
	return s.serverID
}

// alive probes the node behind s and reports whether it answered within
// timeout.
func (s *session) alive(timeout time.Duration) bool {
	ack := make(chan struct{}, 1)
	s.mu.Lock()
	if s.stopping || s.send == nil {
		s.mu.Unlock()
		return false
	}
	s.serverID++
	id := s.serverID
	s.probeID, s.probeAck = id, ack
	s.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	sent := make(chan error, 1)
	// The write has its own deadline on the framed transport; on gRPC
	// it may block while the node reads nothing, so it does not hold
	// the caller past timeout.
	go func() {
		sent <- s.send(&gatewayv1.SessionResponse{Id: id, Body: &gatewayv1.SessionResponse_Probe{Probe: &gatewayv1.Ping{}}})
	}()
	select {
	case err := <-sent:
		if err != nil {
			return false
		}
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

// probeAnswered takes the node's answer to a probe.
func (s *session) probeAnswered(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.probeAck != nil && id == s.probeID {
		s.probeAck <- struct{}{}
		s.probeAck = nil
	}
}

// revoke ends the session with a RevocationNotice.
func (s *session) revoke(n *gatewayv1.RevocationNotice) {
	err := refused(codes.Unauthenticated, "certificate revoked: %s", n.Reason)
	if s.stop(err, &gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_Revoked{Revoked: n}}) && s.s != nil {
		s.s.log.InfoContext(s.ctx, "session ended by revocation", logkey.NodeID, s.nodeID, logkey.Reason, n.Reason)
	}
}

// replace ends the session for a newer one of its node.
func (s *session) replace() {
	s.stop(refused(codes.Aborted, "replaced by a newer session of this node (the same process reconnected, or a new one after this one stopped answering)"), nil)
}

// shutdown ends the session because fleetd stops.
func (s *session) shutdown() {
	s.stop(refused(codes.Unavailable, "fleetd is shutting down; reconnect"), nil)
}

// check asks the node for boot evidence now (CheckNode); the outcome
// reaches call.result. It reports false when the session is ending.
func (s *session) check(call *checkCall) bool {
	s.mu.Lock()
	stopping := s.stopping
	s.mu.Unlock()
	if stopping {
		return false
	}
	bn, dropped, err := s.s.giveNonce(s.book, gatewayv1.NoncePurpose_NONCE_PURPOSE_BOOT_CHECK, call.result)
	if errors.Is(err, errSessionEnded) {
		return false
	}
	if err != nil {
		call.result <- checkOutcome{err: err}
		return true
	}
	if dropped != nil {
		s.s.unanswered(s.ctx, s.nodeID, ignoredReplaced, []*issuedNonce{dropped})
	}
	if err := s.send(&gatewayv1.SessionResponse{Id: s.nextServerID(), Body: &gatewayv1.SessionResponse_Nonce{Nonce: bn}}); err != nil {
		// The session is broken; its end reports the nonce unanswered.
		s.s.log.DebugContext(s.ctx, "boot check not sent", logkey.NodeID, s.nodeID, logkey.Error, err)
	}
	return true
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
		old.replace()
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
		old.replace()
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

// closeAll ends every session on this server (shutdown), and those that
// open after; their nodes reconnect, to this server when it is back or to
// another replica.
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
	for _, sess := range r.byNode {
		sess.shutdown()
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
	sess.replace()
	return true
}

// count is the number of live sessions.
func (r *sessions) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byNode)
}

// errSessionEnded is what a write to a session that already ended returns.
var errSessionEnded = errors.New("the session has ended")

type gateway struct {
	gatewayv1.UnimplementedGatewayServer
	s *Server
}

// open starts a node's session from its first message: it registers the
// session (settling a second live session of the node: clone or
// leftover), claims it across replicas and welcomes the node. On success
// the caller runs the session and then calls close. send must be safe for
// concurrent use; onStop (may be nil) becomes the session's.
func (g *gateway) open(ctx context.Context, caller *authedNode, first *gatewayv1.SessionRequest, send func(*gatewayv1.SessionResponse) error, onStop func(*session)) (*session, error) {
	s := g.s
	hello := first.GetHello()
	if hello == nil || hello.InstanceId == "" || len(hello.InstanceId) > maxInstanceID {
		return nil, refused(codes.InvalidArgument, "a session starts with Hello naming the process's instance id")
	}
	sess := newSession(caller.node.ID, hello.InstanceId)
	sess.s, sess.ctx, sess.caller, sess.send, sess.onStop = s, ctx, caller, send, onStop
	sess.generation = caller.node.Generation
	sess.book.onExpire = func(gone []*issuedNonce) { s.unanswered(ctx, sess.nodeID, ignoredTimeout, gone) }
	if old := s.sessions.add(sess); old != nil {
		// Another process holds a session for this node. If it still
		// answers, one certificate is live in two places.
		if old.alive(s.cfg.ProbeTimeout) || !s.sessions.swap(old, sess) {
			close(sess.done)
			reason := fmt.Sprintf("certificate looks cloned: two live sessions at once (instances %s and %s)", capClaim(old.instance), capClaim(sess.instance))
			gen := s.revokeCloned(ctx, caller.node.ID, reason)
			_ = send(&gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_Revoked{Revoked: &gatewayv1.RevocationNotice{Reason: reason, IdentityGeneration: gen}}})
			return nil, refused(codes.Unauthenticated, "certificate revoked: %s", reason)
		}
		s.log.InfoContext(ctx, "session replaced one that no longer answers", logkey.NodeID, sess.nodeID)
	}
	if notice, err := s.claimAcrossReplicas(ctx, sess); err != nil || notice != nil {
		s.sessions.remove(sess)
		sess.book.close()
		close(sess.done)
		if err != nil {
			return nil, err
		}
		_ = send(&gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_Revoked{Revoked: notice}})
		return nil, refused(codes.Unauthenticated, "certificate revoked: %s", notice.Reason)
	}
	s.log.InfoContext(ctx, "session opened", logkey.NodeID, sess.nodeID, logkey.Instance, capClaim(sess.instance), logkey.Peer, peerAddr(ctx))
	select {
	case <-s.sessions.closed():
		sess.shutdown()
	default:
	}
	if err := send(&gatewayv1.SessionResponse{Id: first.Id, Body: &gatewayv1.SessionResponse_Welcome{Welcome: &gatewayv1.Welcome{
		NodeId: sess.nodeID, ServerTimeUnixNano: s.cfg.Now().UnixNano(),
	}}}); err != nil {
		g.close(sess)
		return nil, err
	}
	return sess, nil
}

// close cleans up after a session ended: nonces never answered are
// counted (they change nothing), and the session leaves the replicas'
// record and the registry.
func (g *gateway) close(sess *session) {
	ctx := context.WithoutCancel(sess.ctx)
	g.s.unanswered(ctx, sess.nodeID, ignoredSessionEnded, sess.book.close())
	g.s.releaseAcrossReplicas(ctx, sess)
	g.s.sessions.remove(sess)
	g.s.revfeed.unsubscribe(sess)
	close(sess.done)
}

// onRequest answers one message of the node, on the transport's reader.
// An error means the answer could not be written: the session is broken.
func (g *gateway) onRequest(sess *session, m *gatewayv1.SessionRequest) error {
	if m.GetProbeAck() != nil {
		sess.probeAnswered(m.Id)
		return nil
	}
	if m.GetRevocationFeed() != nil {
		return g.s.subscribeRevocations(sess.ctx, sess, m.Id)
	}
	return sess.send(g.handle(sess.ctx, sess.caller, sess.book, m))
}

// Session is a node's live session on a gRPC stream: its renewals travel
// on it, and a revocation reaches the node through it. Nodes that speak
// the framed session (serveFramed) use that instead: it costs the server
// one goroutine where this costs five.
func (g *gateway) Session(stream gatewayv1.Gateway_SessionServer) error {
	ctx := stream.Context()
	caller, err := g.s.nodeFromPeer(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	// A gRPC stream takes one Send at a time, and none once its handler
	// returned.
	var sendMu sync.Mutex
	returned := false
	send := func(m *gatewayv1.SessionResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		if returned {
			return errSessionEnded
		}
		return stream.Send(m)
	}
	defer func() {
		sendMu.Lock()
		returned = true
		sendMu.Unlock()
	}()
	sess, err := g.open(ctx, caller, first, send, nil)
	if err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		// The reader answers the requests, so it cleans up after the
		// last: nothing (a feed subscription, a nonce) is registered
		// for the session after its close. Its Recv ends when the
		// handler returns.
		defer g.close(sess)
		for {
			m, err := stream.Recv()
			if err == nil {
				err = g.onRequest(sess, m)
			}
			if err != nil {
				recvErr <- err
				return
			}
		}
	}()
	select {
	case <-sess.stopped:
		final, err := sess.ending()
		if final != nil {
			_ = send(final)
		}
		return err
	case err := <-recvErr:
		g.s.log.DebugContext(ctx, "session closed", logkey.NodeID, sess.nodeID, logkey.Error, err)
		return nil
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
