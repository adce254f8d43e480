package load

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// daemonVersion is what simulated nodes report.
const daemonVersion = "nodetrust-load"

// simNode is one simulated machine.
type simNode struct {
	idx    int
	claims *joinv1.HardwareClaims
	token  string

	// The join request, prepared before the join phase.
	key     *ecdsa.PrivateKey
	req     *joinv1.JoinRequest
	csrHash []byte

	// The join's answer, and what it gave once checked.
	signed *joinv1.SignedJoinResult
	joined bool
	nodeID string
	cert   tls.Certificate

	// mu serializes the node's renewals; chain and curKey are the current
	// certificate's.
	mu      sync.Mutex
	chain   [][]byte
	curKey  *ecdsa.PrivateKey
	next    []renewPrep
	renewed []renewDone

	sess        *session
	revoked     bool
	revokeStart time.Time
}

// renewPrep is a renewal's new key and CSR, made before the phase.
type renewPrep struct {
	key     *ecdsa.PrivateKey
	csr     []byte
	csrHash []byte
}

// renewDone is a renewal's answer, checked after the phase.
type renewDone struct {
	prep   renewPrep
	signed *joinv1.SignedJoinResult
}

// newSimNode gives node idx of run runID its own hardware claims: a random
// product UUID and boot id, a hostname (from which the server makes the
// node id) and a locally administered MAC, so no reclaim rule applies.
func newSimNode(runID string, idx int) *simNode {
	b := make([]byte, 38)
	_, _ = rand.Read(b)
	return &simNode{idx: idx, claims: &joinv1.HardwareClaims{
		ProductUuid: uuid(b[:16]),
		BootId:      uuid(b[16:32]),
		Hostname:    fmt.Sprintf("load-%s-%06d", runID, idx),
		Macs:        []string{fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", b[32], b[33], b[34], b[35], b[36])},
	}}
}

func uuid(b []byte) string {
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// prepare makes the node's key and CSR, seals its token to the join
// encryption key bound to the CSR (as agent.Join does), and makes the keys
// and CSRs of its renewals.
func (n *simNode) prepare(jwk *pki.JoinEncryptionPublicKey, role string, renewals int) error {
	var err error
	if n.key, err = pki.GenerateKey(); err != nil {
		return err
	}
	csr, err := pki.CreateCSR(n.key)
	if err != nil {
		return err
	}
	h := sha256.Sum256(csr)
	n.csrHash = h[:]
	sealed, err := pki.SealToken(jwk, n.csrHash, []byte(n.token))
	if err != nil {
		return fmt.Errorf("seal the join token: %w", err)
	}
	n.req = &joinv1.JoinRequest{Csr: csr, Attestor: "token", SealedToken: sealed, Claims: n.claims, DaemonVersion: daemonVersion, Role: role}
	n.next = make([]renewPrep, renewals)
	for i := range n.next {
		k, err := pki.GenerateKey()
		if err != nil {
			return err
		}
		csr, err := pki.CreateCSR(k)
		if err != nil {
			return err
		}
		h := sha256.Sum256(csr)
		n.next[i] = renewPrep{key: k, csr: csr, csrHash: h[:]}
	}
	return nil
}

// target is what every connection to the control plane needs.
type target struct {
	// addrs are the control plane's addresses (several replicas): each
	// connection takes the next, in turn.
	addrs      []string
	next       atomic.Uint64
	serverName string
	pins       *pki.Bundle

	// transport is the sessions' (transportFramed or transportGRPC).
	transport string
	// refused holds the addresses that refused the framed session: the
	// sessions after the first go over gRPC there at once, without a
	// refused handshake each.
	refused sync.Map
	// framed and grpc count the sessions opened over each; fellBack
	// those over gRPC because the server refused the framed session.
	framed, grpc, fellBack atomic.Int64
}

// Session transports (--session-transport).
const (
	transportFramed = "framed"
	transportGRPC   = "grpc"
)

// pick returns the address the next connection takes.
func (t *target) pick() string {
	return t.addrs[(t.next.Add(1)-1)%uint64(len(t.addrs))]
}

// tlsConfig is a connection's TLS configuration, pinned to the serving CA
// as agent.Dial's; cert, when set, is the client certificate.
func (t *target) tlsConfig(cert *tls.Certificate) *tls.Config {
	var get func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	if cert != nil {
		get = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return tlspin.Client(t.pins.ServingCASPKIPin, t.serverName, get)
}

// clientOptions keep the load tool's own memory per connection small;
// they change nothing on the wire.
var clientOptions = []grpc.DialOption{
	grpc.WithReadBufferSize(4 << 10),
	grpc.WithWriteBufferSize(4 << 10),
}

// dial opens a client connection pinned to the serving CA, as agent.Dial
// does; cert, when set, is the client certificate.
func (t *target) dial(cert *tls.Certificate) (*grpc.ClientConn, error) {
	return t.dialAddr(t.pick(), cert)
}

func (t *target) dialAddr(addr string, cert *tls.Certificate) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(t.tlsConfig(cert)))}, clientOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

// sessionStream is a live session's messages on either transport: the
// gRPC Session stream and the framed session's client both end with a
// gRPC status error.
type sessionStream interface {
	Send(*gatewayv1.SessionRequest) error
	Recv() (*gatewayv1.SessionResponse, error)
}

// openStream opens a session's stream to the next address, on t's
// transport: framed, or gRPC where the server refuses the framed session
// (counted). Its transport closes when ctx ends and when closeConn is
// called.
func (t *target) openStream(ctx context.Context, cert *tls.Certificate, timeout time.Duration) (stream sessionStream, closeConn func(), err error) {
	addr := t.pick()
	if _, refused := t.refused.Load(addr); t.transport == transportFramed && !refused {
		dctx, cancel := context.WithTimeout(ctx, timeout)
		c, err := sessionframe.Dial(dctx, addr, t.tlsConfig(cert), timeout)
		cancel()
		switch {
		case err == nil:
			stop := context.AfterFunc(ctx, func() { _ = c.Close() })
			t.framed.Add(1)
			return c, func() { stop(); _ = c.Close() }, nil
		case errors.Is(err, sessionframe.ErrNotOffered):
			t.refused.Store(addr, true)
			t.fellBack.Add(1)
		default:
			return nil, nil, &opError{code: codes.Unavailable, msg: fmt.Sprintf("dial the framed session: %v", err)}
		}
	} else if refused {
		t.fellBack.Add(1)
	}
	conn, err := t.dialAddr(addr, cert)
	if err != nil {
		return nil, nil, err
	}
	st, err := gatewayv1.NewGatewayClient(conn).Session(ctx)
	if err != nil {
		conn.Close()
		return nil, nil, rpcError(err, nil)
	}
	t.grpc.Add(1)
	return st, func() { conn.Close() }, nil
}

// opError is a failed operation with its gRPC code and the server's
// pushback, if any.
type opError struct {
	code     codes.Code
	msg      string
	pushback time.Duration
}

func (e *opError) Error() string { return e.code.String() + ": " + e.msg }

func rpcError(err error, trailer metadata.MD) error {
	st := status.Convert(err)
	e := &opError{code: st.Code(), msg: st.Message()}
	if v := trailer.Get("grpc-retry-pushback-ms"); len(v) > 0 {
		if ms, err := strconv.ParseInt(v[0], 10, 64); err == nil && ms >= 0 {
			e.pushback = time.Duration(ms) * time.Millisecond
		}
	}
	return e
}

// join sends the node's prepared request on a fresh TLS connection, closed
// after, and keeps the answer for checking.
func (n *simNode) join(ctx context.Context, t *target, timeout time.Duration) error {
	conn, err := t.dial(nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var trailer metadata.MD
	resp, err := joinv1.NewJoinServiceClient(conn).Join(ctx, n.req, grpc.Trailer(&trailer))
	if err != nil {
		return rpcError(err, trailer)
	}
	signed := resp.GetSigned()
	if signed == nil {
		return fmt.Errorf("the join was deferred (%T), not answered", resp.Result)
	}
	n.signed = signed
	return nil
}

// checkJoin checks the join's answer as agent.Join does.
func (n *simNode) checkJoin(pins *pki.Bundle, role string) error {
	if n.signed == nil {
		return errors.New("no answer")
	}
	opened, err := joinresponse.Open(n.signed, joinresponse.Expect{
		SigningKeyPin: pins.JoinSigningKeyPin, CSRSHA256: n.csrHash, PublicKey: n.key.Public(),
		TrustDomain: pins.TrustDomain, Role: role, Now: time.Now(),
	})
	if err != nil {
		return err
	}
	r := opened.Result
	n.nodeID, n.chain, n.curKey = r.NodeId, r.Chain, n.key
	n.cert = tls.Certificate{Certificate: r.Chain, PrivateKey: n.key, Leaf: opened.Leaf}
	n.joined = true
	return nil
}

// session is a node's live Gateway session as the load tool holds it.
type session struct {
	// closeConn closes the session's connection.
	closeConn func()
	stream    sessionStream
	cancel    context.CancelFunc
	sendMu    sync.Mutex
	ids       atomic.Uint64

	mu      sync.Mutex
	waiting map[uint64]chan *gatewayv1.SessionResponse

	// notice is closed when a RevocationNotice arrives, at noticeAt; ended
	// when the stream ends, at endedAt with endErr. Both times are written
	// before the close.
	notice     chan struct{}
	noticeAt   time.Time
	noticeOnce sync.Once
	ended      chan struct{}
	endedAt    time.Time
	endErr     error
	// closing is set when the tool itself ends the session.
	closing atomic.Bool
}

// openSession opens the node's live session over its own mutual TLS
// connection (framed, or gRPC), sends Hello and waits for Welcome; then
// the session answers probes and collects answers until it ends.
func (n *simNode) openSession(ctx context.Context, t *target, timeout time.Duration) error {
	sctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(timeout, cancel)
	stream, closeConn, err := t.openStream(sctx, &n.cert, timeout)
	if err != nil {
		timer.Stop()
		cancel()
		return err
	}
	s := &session{closeConn: closeConn, stream: stream, cancel: cancel, waiting: map[uint64]chan *gatewayv1.SessionResponse{},
		notice: make(chan struct{}), ended: make(chan struct{})}
	fail := func(err error) error {
		cancel()
		closeConn()
		return err
	}
	s.ids.Store(1)
	instance := make([]byte, 16)
	_, _ = rand.Read(instance)
	hello := &gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{DaemonVersion: daemonVersion, InstanceId: hex.EncodeToString(instance)}}}
	if err := s.stream.Send(hello); err != nil {
		_, rerr := s.stream.Recv()
		return fail(rpcError(errors.Join(rerr, err), nil))
	}
	first, err := s.stream.Recv()
	if !timer.Stop() {
		return fail(fmt.Errorf("no Welcome within %s", timeout))
	}
	if err != nil {
		return fail(rpcError(err, nil))
	}
	if first.GetWelcome() == nil {
		return fail(fmt.Errorf("the session began with %T, not Welcome", first.Body))
	}
	if got := first.GetWelcome().NodeId; got != n.nodeID {
		return fail(fmt.Errorf("welcomed as node %s, not %s", got, n.nodeID))
	}
	n.sess = s
	go s.receive()
	return nil
}

func (s *session) send(m *gatewayv1.SessionRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(m)
}

// receive runs for the session's life: it answers probes at once, notes a
// revocation notice, and hands answers to the calls waiting for them.
func (s *session) receive() {
	for {
		m, err := s.stream.Recv()
		if err != nil {
			s.endedAt, s.endErr = time.Now(), err
			close(s.ended)
			return
		}
		switch m.Body.(type) {
		case *gatewayv1.SessionResponse_Probe:
			_ = s.send(&gatewayv1.SessionRequest{Id: m.Id, Body: &gatewayv1.SessionRequest_ProbeAck{ProbeAck: &gatewayv1.Pong{}}})
		case *gatewayv1.SessionResponse_Revoked:
			s.noticeOnce.Do(func() { s.noticeAt = time.Now(); close(s.notice) })
		default:
			s.mu.Lock()
			ch := s.waiting[m.Id]
			delete(s.waiting, m.Id)
			s.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		}
	}
}

// call sends m with a new id and waits for its answer.
func (s *session) call(m *gatewayv1.SessionRequest, timeout time.Duration) (*gatewayv1.SessionResponse, error) {
	id := s.ids.Add(1)
	m.Id = id
	ch := make(chan *gatewayv1.SessionResponse, 1)
	s.mu.Lock()
	s.waiting[id] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.waiting, id)
		s.mu.Unlock()
	}()
	if err := s.send(m); err != nil {
		return nil, fmt.Errorf("send on the session: %w", err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case resp := <-ch:
		return resp, nil
	case <-s.ended:
		return nil, fmt.Errorf("the session ended: %w", rpcError(s.endErr, nil))
	case <-t.C:
		return nil, fmt.Errorf("no answer on the session within %s", timeout)
	}
}

// close ends the session from the tool's side.
func (s *session) close() {
	s.closing.Store(true)
	s.cancel()
	s.closeConn()
}

// isEnded reports whether the stream has ended.
func (s *session) isEnded() bool {
	select {
	case <-s.ended:
		return true
	default:
		return false
	}
}

func (s *session) hasNotice() bool {
	select {
	case <-s.notice:
		return true
	default:
		return false
	}
}

// renew makes the node's renewal number round over its session, as
// agent's node does: the prepared new key's CSR, a proof of possession by
// the current key, the current chain. The answer is checked after the
// phase; the chain it carries is the one the next renewal presents.
func (n *simNode) renew(round int, timeout time.Duration) error {
	p := n.next[round]
	t := time.Now().UnixNano()
	proof, err := pki.SignRenewProof(n.curKey, p.csrHash, t)
	if err != nil {
		return err
	}
	req := &joinv1.RenewRequest{Csr: p.csr, Chain: n.chain, ClientTimeUnixNano: t, Proof: proof}
	resp, err := n.sess.call(&gatewayv1.SessionRequest{Body: &gatewayv1.SessionRequest_Renew{Renew: req}}, timeout)
	if err != nil {
		return err
	}
	if e := resp.GetError(); e != nil {
		return &opError{code: codes.Code(e.Code), msg: e.Message, pushback: time.Duration(e.RetryPushbackMs) * time.Millisecond}
	}
	signed := resp.GetRenew().GetSigned()
	if signed == nil {
		return fmt.Errorf("the renewal was answered with %T", resp.Body)
	}
	var res joinv1.JoinResult
	if err := proto.Unmarshal(signed.Payload, &res); err != nil {
		return fmt.Errorf("read the renewal's result: %w", err)
	}
	n.chain, n.curKey = res.Chain, p.key
	n.renewed = append(n.renewed, renewDone{prep: p, signed: signed})
	return nil
}

// checkRenewals checks each renewal's answer as agent's node does: signed
// under the pinned key, for this CSR, certifying the new key, same node,
// trust domain and role. It returns the pins of the keys certified.
func (n *simNode) checkRenewals(pins *pki.Bundle, role string) ([]pki.Pin, error) {
	var out []pki.Pin
	for i, r := range n.renewed {
		opened, err := joinresponse.Open(r.signed, joinresponse.Expect{
			SigningKeyPin: pins.JoinSigningKeyPin, CSRSHA256: r.prep.csrHash, PublicKey: r.prep.key.Public(),
			TrustDomain: pins.TrustDomain, NodeID: n.nodeID, Role: role, Now: time.Now(),
		})
		if err != nil {
			return out, fmt.Errorf("renewal %d: %w", i+1, err)
		}
		pin, err := pki.PinOf(opened.Leaf.PublicKey)
		if err != nil {
			return out, fmt.Errorf("renewal %d: %w", i+1, err)
		}
		out = append(out, pin)
	}
	return out, nil
}
