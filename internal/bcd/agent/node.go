package agent

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
	"github.com/nodetrust/nodetrust/tpm"
)

// ErrRevoked means the control plane revoked this node's certificate. The
// agent stops and never redials with it; the machine comes back only by
// joining again with fresh evidence after bcd join --reset.
var ErrRevoked = errors.New("this node's certificate was revoked")

// ErrRefused means the control plane refuses this node's certificate when
// it opens a session (revoked while the node was away, expired, or of an
// older identity generation).
var ErrRefused = errors.New("the control plane refuses this node's certificate")

// ErrExpired means the node certificate expired (while the node was off, or
// while every renewal failed, such as on a full disk): an expired
// certificate never renews, so the agent stops instead of retrying forever.
var ErrExpired = errors.New("this node's certificate expired")

// Journal records what happens to the identity; a nil Journal records
// nothing. The node's journal.db implements it.
type Journal interface {
	Append(ctx context.Context, kind, nodeID, detail string) error
}

// Journal kinds the agent writes.
const (
	JournalRenewed       = "renewed"
	JournalRenewalFailed = "renewal failed"
	JournalRevoked       = "revoked"
	JournalRefused       = "refused"
)

// NodeConfig configures the long-running agent.
type NodeConfig struct {
	// Servers are the control plane's addresses (its replicas); the
	// session moves to another when one is down, and the well-known
	// document may add more.
	Servers    []string
	ServerName string
	Pins       config.Pins
	DataDir    string
	Version    string
	Logger     *slog.Logger
	Journal    Journal
	// State, when set, is the identity already loaded (and its key
	// already in the TPM), which the agent takes over instead of loading
	// it again; a TPM without a resource manager has few object slots.
	State *identity.State
	// OnRenew, when set, is told each new state after a renewal, so other
	// users of the identity (the local API's federation listener) follow.
	OnRenew func(*identity.State)
	// TPM is the host's TPM, or nil. Next keys go into it, and a
	// certificate that names a TPM AK renews only with that AK.
	TPM TPM

	// RenewFraction of a leaf's lifetime passes before it is renewed
	// (default 0.6).
	RenewFraction float64
	// Renewal failures back off from BackoffMin to BackoffMax (default
	// 30 s and 10 min), or wait exactly a server's pushback.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// OldKeyGrace is how long the previous key stays loaded after a
	// renewal (default 5 min).
	OldKeyGrace time.Duration
	// AfterStore is called after each renewal storage step with its name
	// (identity.StepNextKey, StepIdentity, StepPromote); tests use it to
	// kill the process there.
	AfterStore func(step string)
	Now        func() time.Time

	// BootCheckInterval is how often the node sends boot evidence when
	// its certificate names an AK (default 1 h, with a tenth of jitter);
	// the control plane may also ask for it at any time.
	BootCheckInterval time.Duration
	// EventLogPath is the measurement log sent with the evidence
	// (default DefaultEventLogPath); NoEventLog sends none (a TPM that
	// measured no boot of this host, such as swtpm).
	EventLogPath string
	NoEventLog   bool

	// SessionTransport is TransportFramed (the default: the framed
	// session, or gRPC at a control plane that does not offer it) or
	// TransportGRPC (the gRPC Session always).
	SessionTransport string

	// sleep waits before the next session (default: a timer that ends
	// early with ctx); tests set it (export_test.go) to see the wait the
	// agent chose without spending it.
	sleep func(ctx context.Context, d time.Duration) error

	// PeerRevoked, when set, subscribes the session to the control plane's
	// revocation feed and is told each revoked certificate of another node
	// (its node id, serial in lower-case hex, and expiry, zero when
	// unknown), so the local daemon refuses machine proofs made with it
	// (see revfeed.go).
	PeerRevoked func(nodeID, serial string, notAfter time.Time)
}

func (c *NodeConfig) defaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RenewFraction <= 0 || c.RenewFraction >= 1 {
		c.RenewFraction = DefaultRenewFraction
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 30 * time.Second
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 10 * time.Minute
	}
	if c.OldKeyGrace <= 0 {
		c.OldKeyGrace = 5 * time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.BootCheckInterval <= 0 {
		c.BootCheckInterval = DefaultBootCheckInterval
	}
	if c.EventLogPath == "" {
		c.EventLogPath = DefaultEventLogPath
	}
	if c.SessionTransport == "" {
		c.SessionTransport = TransportFramed
	}
	if c.sleep == nil {
		c.sleep = sleep
	}
}

// node is the agent's state while it runs.
type node struct {
	c        NodeConfig
	log      *slog.Logger
	instance string

	mu   sync.Mutex
	st   *identity.State
	cert *tls.Certificate
	prev crypto.Signer // the previous key, held for OldKeyGrace

	// renewal bookkeeping
	attempt   int
	backoff   time.Duration
	nextRenew time.Time
	lastErr   error // the last renewal's failure, nil after a success
}

// RunNode runs the agent until ctx ends (nil), the certificate is revoked
// (ErrRevoked), refused (ErrRefused) or expired (ErrExpired), or the
// identity cannot be loaded. It keeps one live session with the control
// plane and renews over it.
func RunNode(ctx context.Context, c NodeConfig) error {
	c.defaults()
	switch c.SessionTransport {
	case TransportFramed, TransportGRPC:
	default:
		return fmt.Errorf("session transport %q: want %q or %q", c.SessionTransport, TransportFramed, TransportGRPC)
	}
	st := c.State
	if st == nil {
		var err error
		if st, err = identity.LoadState(c.DataDir, identity.LoadOptions{KeyLoader: Keys{TPM: c.TPM}.Loader(ctx)}); err != nil {
			return err
		}
	}
	n := &node{c: c, log: c.Logger.With(logkey.Component, "agent", logkey.NodeID, st.Identity.NodeID), instance: randomID()}
	n.setState(st)
	n.nextRenew = n.renewTime()
	if err := n.expired(ctx, nil); err != nil {
		return err
	}
	conn, _, endpoints, err := Dial(c.Servers, c.ServerName, c.Pins.ServingCA, n.clientCert)
	if err != nil {
		return err
	}
	defer conn.Close()
	tc, _ := clientTLS(c.ServerName, c.Pins.ServingCA, n.clientCert)
	sessions := &sessionDialer{gw: gatewayv1.NewGatewayClient(conn), endpoints: endpoints, configured: len(c.Servers), tls: tc, grpcOnly: c.SessionTransport == TransportGRPC}
	n.learnEndpoints(ctx, joinv1.NewJoinServiceClient(conn), endpoints)

	reconnect := time.Second
	for {
		err := n.session(ctx, sessions)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrRevoked), errors.Is(err, ErrRefused), errors.Is(err, ErrExpired):
			return err
		}
		if xerr := n.expired(ctx, n.lastErr); xerr != nil {
			return xerr
		}
		wait := reconnectWait(reconnect, sessionPushback(err), n.state().Leaf.NotAfter.Sub(c.Now()))
		n.log.WarnContext(ctx, "session lost, reconnecting", "retry_in", wait.String(), logkey.Error, err)
		n.learnEndpoints(ctx, joinv1.NewJoinServiceClient(conn), endpoints)
		if err := c.sleep(ctx, wait); err != nil {
			return nil
		}
		reconnect = min(reconnect*2, 30*time.Second)
		if err == nil {
			reconnect = time.Second
		}
	}
}

func (n *node) setState(st *identity.State) {
	chain := make([][]byte, 0, len(st.Chain))
	for _, c := range st.Chain {
		chain = append(chain, c.Raw)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.st = st
	n.cert = &tls.Certificate{Certificate: chain, PrivateKey: st.Key, Leaf: st.Leaf}
}

func (n *node) state() *identity.State {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.st
}

// clientCert hands TLS the current certificate, so a reconnect after a
// renewal uses the new one.
func (n *node) clientCert(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cert, nil
}

// untilRenew is how long the next renewal attempt waits, on the agent's
// clock (NodeConfig.Now), the one nextRenew was computed on.
func (n *node) untilRenew() time.Duration { return n.nextRenew.Sub(n.c.Now()) }

// renewTime is RenewFraction into the current leaf's lifetime.
func (n *node) renewTime() time.Time {
	return RenewTime(n.state().Leaf, n.c.RenewFraction)
}

// DefaultRenewFraction is the seed's renewFraction: a certificate is
// renewed once 60% of its lifetime has passed.
const DefaultRenewFraction = 0.6

// RenewTime is when the agent renews leaf: fraction of its lifetime after
// its NotBefore (DefaultRenewFraction when fraction is not in (0, 1)).
func RenewTime(leaf *x509.Certificate, fraction float64) time.Time {
	if fraction <= 0 || fraction >= 1 {
		fraction = DefaultRenewFraction
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotBefore.Add(time.Duration(float64(life) * fraction))
}

// session runs one live session until it breaks, over whichever
// transport sessions opens.
func (n *node) session(ctx context.Context, sessions *sessionDialer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, transport, end, err := sessions.open(ctx)
	if err != nil {
		return err
	}
	defer end()
	if err := stream.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{DaemonVersion: n.c.Version, InstanceId: n.instance}}}); err != nil {
		// The server may have ended the session before it read the
		// Hello (it checks the certificate first): a gRPC stream's Send
		// then says io.EOF, and its Recv, which returns at once, says
		// why, with the trailer's pushback.
		if errors.Is(err, io.EOF) {
			if _, rerr := stream.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
				return n.streamErr(ctx, stream, rerr)
			}
		}
		return n.streamErr(ctx, nil, err)
	}
	first, err := stream.Recv()
	if err != nil {
		return n.streamErr(ctx, stream, err)
	}
	if r := first.GetRevoked(); r != nil {
		return n.revoked(ctx, r)
	}
	if first.GetWelcome() == nil {
		return fmt.Errorf("the control plane did not welcome the session")
	}
	n.log.InfoContext(ctx, "session open", logkey.Instance, n.instance, "transport", transport)

	msgs := make(chan *gatewayv1.SessionResponse)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()

	var (
		nextID   uint64 = 1
		inflight *renewal
		deadline <-chan time.Time
		// nonceFor is the id of a NonceRequest for a renewal in flight
		// (a certificate that names an AK renews with a fresh quote);
		// checkID that of one for a boot check.
		nonceFor uint64
		checkID  uint64
	)
	defer func() {
		if inflight != nil {
			closeKey(inflight.key)
		}
	}()
	if req := n.revocationFeedRequest(nextID + 1); req != nil {
		nextID++
		if err := stream.Send(req); err != nil {
			return err
		}
	}
	timer := time.NewTimer(n.untilRenew())
	defer timer.Stop()
	checks := time.NewTimer(jittered(n.c.BootCheckInterval))
	defer checks.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return n.streamErr(ctx, stream, err)
		case <-checks.C:
			checks.Reset(jittered(n.c.BootCheckInterval))
			if !n.bootChecks() {
				continue
			}
			nextID++
			checkID = nextID
			if err := stream.Send(&gatewayv1.SessionRequest{Id: checkID, Body: &gatewayv1.SessionRequest_NonceRequest{NonceRequest: &gatewayv1.NonceRequest{Purpose: gatewayv1.NoncePurpose_NONCE_PURPOSE_BOOT_CHECK}}}); err != nil {
				return err
			}
		case <-timer.C:
			if inflight != nil || nonceFor != 0 {
				continue
			}
			if err := n.expired(ctx, n.lastErr); err != nil {
				return err
			}
			if len(n.akName()) > 0 {
				// Ask for the nonce the renewal's quote covers first.
				nextID++
				nonceFor = nextID
				if err := stream.Send(&gatewayv1.SessionRequest{Id: nonceFor, Body: &gatewayv1.SessionRequest_NonceRequest{NonceRequest: &gatewayv1.NonceRequest{Purpose: gatewayv1.NoncePurpose_NONCE_PURPOSE_RENEWAL}}}); err != nil {
					return err
				}
				deadline = time.After(30 * time.Second)
				continue
			}
			r, err := n.startRenewal(ctx, nil)
			if err != nil {
				n.renewalFailed(ctx, err, 0)
				timer.Reset(n.untilRenew())
				continue
			}
			nextID++
			r.id = nextID
			if err := stream.Send(&gatewayv1.SessionRequest{Id: r.id, Body: &gatewayv1.SessionRequest_Renew{Renew: r.req}}); err != nil {
				return err
			}
			inflight = r
			deadline = time.After(30 * time.Second)
		case <-deadline:
			n.renewalFailed(ctx, errors.New("no answer to the renewal within 30s"), 0)
			if inflight != nil {
				closeKey(inflight.key)
			}
			inflight, deadline, nonceFor = nil, nil, 0
			timer.Reset(n.untilRenew())
		case m := <-msgs:
			switch b := m.Body.(type) {
			case *gatewayv1.SessionResponse_Revoked:
				return n.revoked(ctx, b.Revoked)
			case *gatewayv1.SessionResponse_Nonce:
				bn := b.Nonce
				if nonceFor != 0 && m.Id == nonceFor && bn.Purpose == gatewayv1.NoncePurpose_NONCE_PURPOSE_RENEWAL {
					nonceFor = 0
					r, err := n.startRenewal(ctx, bn.Nonce)
					if err != nil {
						n.renewalFailed(ctx, err, 0)
						deadline = nil
						timer.Reset(n.untilRenew())
						continue
					}
					nextID++
					r.id = nextID
					req := &gatewayv1.SessionRequest{Id: r.id, Body: &gatewayv1.SessionRequest_Renew{Renew: r.req}}
					if r.attested != nil {
						req.Body = &gatewayv1.SessionRequest_AttestedRenew{AttestedRenew: r.attested}
					}
					if err := stream.Send(req); err != nil {
						return err
					}
					inflight = r
					deadline = time.After(30 * time.Second)
					continue
				}
				if bn.Purpose != gatewayv1.NoncePurpose_NONCE_PURPOSE_BOOT_CHECK {
					continue
				}
				// A boot check: the node's own (checkID) or one the
				// control plane asks for now.
				ev := n.bootEvidence(ctx, bn.Nonce)
				if ev.Error != "" {
					n.log.WarnContext(ctx, "boot evidence could not be made", logkey.Error, ev.Error)
				}
				if err := stream.Send(&gatewayv1.SessionRequest{Id: m.Id, Body: &gatewayv1.SessionRequest_BootEvidence{BootEvidence: ev}}); err != nil {
					return err
				}
			case *gatewayv1.SessionResponse_BootResult:
				n.bootResult(ctx, b.BootResult)
			case *gatewayv1.SessionResponse_RevokedCerts:
				n.peersRevoked(ctx, b.RevokedCerts)
			case *gatewayv1.SessionResponse_Probe:
				if err := stream.Send(&gatewayv1.SessionRequest{Id: m.Id, Body: &gatewayv1.SessionRequest_ProbeAck{ProbeAck: &gatewayv1.Pong{}}}); err != nil {
					return err
				}
			case *gatewayv1.SessionResponse_Renew:
				if inflight == nil || m.Id != inflight.id {
					continue
				}
				if err := n.finishRenewal(ctx, inflight, b.Renew.GetSigned()); err != nil {
					n.renewalFailed(ctx, err, 0)
					closeKey(inflight.key)
				}
				inflight, deadline = nil, nil
				timer.Reset(n.untilRenew())
			case *gatewayv1.SessionResponse_Error:
				if checkID != 0 && m.Id == checkID {
					n.log.DebugContext(ctx, "boot check not taken", logkey.Error, b.Error.Message)
					checkID = 0
					continue
				}
				if nonceFor != 0 && m.Id == nonceFor {
					nonceFor, deadline = 0, nil
					n.renewalFailed(ctx, fmt.Errorf("nonce for the renewal: %s: %s", codes.Code(b.Error.Code), b.Error.Message), time.Duration(b.Error.RetryPushbackMs)*time.Millisecond)
					timer.Reset(n.untilRenew())
					continue
				}
				if inflight == nil || m.Id != inflight.id {
					continue
				}
				e := b.Error
				n.renewalFailed(ctx, fmt.Errorf("%s: %s", codes.Code(e.Code), e.Message), time.Duration(e.RetryPushbackMs)*time.Millisecond)
				closeKey(inflight.key)
				inflight, deadline = nil, nil
				timer.Reset(n.untilRenew())
			}
		}
	}
}

// streamErr classifies a broken session: a refused certificate is final,
// and a session the server ended with a pushback comes back as an
// *endedError carrying it. stream is the session whose Recv returned err,
// or nil when err came from elsewhere (its gRPC trailer may be read only
// once Recv failed).
func (n *node) streamErr(ctx context.Context, stream sessionStream, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if status.Code(err) == codes.Unauthenticated {
		msg := status.Convert(err).Message()
		n.log.ErrorContext(ctx, "the control plane refuses this node's certificate", logkey.Error, msg)
		n.journal(ctx, JournalRefused, msg)
		return fmt.Errorf("%w: %s; it can never renew; join again: %s", ErrRefused, msg, identity.WayBack(n.state().Identity.Attestor))
	}
	if d := endPushback(stream, err); d > 0 {
		return &endedError{err: err, pushback: d}
	}
	return err
}

// endPushback is how long the server asked the node to stay away when it
// ended the session with err (its store is unreachable, say): the framed
// session's SessionEnd.retry_pushback_ms (a *sessionframe.EndError), or
// the gRPC Session's grpc-retry-pushback-ms trailer, read from stream
// (nil: none). Zero when the server gave none.
func endPushback(stream sessionStream, err error) time.Duration {
	if end, ok := errors.AsType[*sessionframe.EndError](err); ok {
		return end.RetryPushback
	}
	if t, ok := stream.(interface{ Trailer() metadata.MD }); ok {
		if d, ok := pushback(t.Trailer()); ok {
			return d
		}
	}
	return 0
}

// endedError is a session the server ended asking the node to wait
// pushback before it opens the next one.
type endedError struct {
	err      error
	pushback time.Duration
}

func (e *endedError) Error() string { return e.err.Error() }
func (e *endedError) Unwrap() error { return e.err }

// sessionPushback is the server's pushback carried by a session's error
// (streamErr), or zero.
func sessionPushback(err error) time.Duration {
	if e, ok := errors.AsType[*endedError](err); ok {
		return e.pushback
	}
	return 0
}

// maxReconnectPushback bounds how long a server's pushback keeps the node
// from its next session: the pushback comes from the network and may be
// a bug's or a hostile server's, and a node that stays away longer may
// miss its renewal. Ten minutes is the renewal backoff's default ceiling
// (NodeConfig.BackoffMax).
const maxReconnectPushback = 10 * time.Minute

// reconnectWait is how long the agent waits before its next session: its
// own backoff, or the server's pushback when that is longer. The pushback
// is capped at maxReconnectPushback and at half of left, the time until
// the current certificate expires, so that a node the server sends away
// near the end of its certificate still comes back while it can renew
// (a certificate with a short lifetime, or one whose renewals failed).
func reconnectWait(backoff, pushback, left time.Duration) time.Duration {
	return max(backoff, min(pushback, maxReconnectPushback, max(left/2, 0)))
}

// expired returns ErrExpired, with the way back, once the current
// certificate's NotAfter has passed; last is the failure that kept it from
// renewing, if any.
func (n *node) expired(ctx context.Context, last error) error {
	st := n.state()
	now := n.c.Now()
	if !now.After(st.Leaf.NotAfter) {
		return nil
	}
	why := ""
	if last != nil {
		why = fmt.Sprintf(" (the last renewal failed: %v)", last)
	}
	n.log.ErrorContext(ctx, "the node certificate expired; an expired certificate never renews", "not_after", st.Leaf.NotAfter.UTC().Format(time.RFC3339), logkey.Error, last)
	return fmt.Errorf("%w at %s%s; an expired certificate never renews, so bcd node stops; join again: %s",
		ErrExpired, st.Leaf.NotAfter.UTC().Format(time.RFC3339), why, identity.WayBack(st.Identity.Attestor))
}

func (n *node) revoked(ctx context.Context, r *gatewayv1.RevocationNotice) error {
	n.log.ErrorContext(ctx, "certificate revoked", logkey.Reason, r.Reason, logkey.Generation, r.IdentityGeneration)
	n.journal(ctx, JournalRevoked, r.Reason)
	return ErrRevoked
}

func (n *node) journal(ctx context.Context, kind, detail string) {
	if n.c.Journal == nil {
		return
	}
	if err := n.c.Journal.Append(context.WithoutCancel(ctx), kind, n.state().Identity.NodeID, detail); err != nil {
		n.log.WarnContext(ctx, "journal append failed", logkey.Error, err)
	}
}

// renewal is one renewal in flight.
type renewal struct {
	id  uint64
	req *joinv1.RenewRequest
	// attested is req with the boot evidence over the session's nonce,
	// for a certificate that names an AK.
	attested *gatewayv1.AttestedRenew
	key      crypto.Signer
	keyPEM   []byte
	keyKind  string
	csrHash  []byte
}

// startRenewal makes the next key, stores it as node.key.next, and builds
// the request with the current key's proof of possession (steps 1–3). A
// certificate that names an AK adds the AK's certification of the next key
// and its quote of the boot over nonce (the session's).
func (n *node) startRenewal(ctx context.Context, nonce []byte) (_ *renewal, err error) {
	st := n.state()
	n.dropPrevious()
	info, err := pki.ParseNodeCert(st.Leaf)
	if err != nil {
		return nil, fmt.Errorf("read the current certificate: %w", err)
	}
	var ak tpm.AttestationKey
	if len(info.TPMAKName) > 0 {
		// No downgrade: a certificate that names an AK renews only with
		// a key that AK certifies, or not at all.
		if ak, err = n.loadAK(ctx, info.TPMAKName); err != nil {
			return nil, err
		}
		defer ak.Close()
	}
	key, keyPEM, kind, err := Keys{TPM: n.c.TPM}.New(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			closeKey(key)
		}
	}()
	if err := identity.WriteNextKey(n.c.DataDir, keyPEM); err != nil {
		return nil, fmt.Errorf("store the next key: %w", err)
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256(csr)
	t := n.c.Now().UnixNano()
	proof, err := pki.SignRenewProof(st.Key, h[:], t)
	if err != nil {
		return nil, fmt.Errorf("sign the renewal proof: %w", err)
	}
	req := &joinv1.RenewRequest{Csr: csr, Chain: st.Identity.Chain, ClientTimeUnixNano: t, Proof: proof}
	if ak != nil {
		tk, ok := key.(tpm.NodeKey)
		if !ok {
			return nil, errors.New("the next key is not in the TPM")
		}
		attest, sig, err := n.c.TPM.Certify(ctx, ak, tk, h[:])
		if err != nil {
			return nil, fmt.Errorf("certify the next key with the AK: %w", err)
		}
		req.KeyAttestation = &joinv1.KeyAttestation{AkPublic: ak.PublicArea(), KeyPublic: tk.PublicArea(), CertifyAttest: attest, CertifySignature: sig}
	}
	r := &renewal{req: req, key: key, keyPEM: keyPEM, keyKind: kind, csrHash: h[:]}
	if ak != nil && nonce != nil {
		r.attested = &gatewayv1.AttestedRenew{Renew: req, Evidence: n.evidence(ctx, ak, nonce)}
	}
	return r, nil
}

// loadAK loads the AK the certificate names and checks it is that AK.
func (n *node) loadAK(ctx context.Context, name []byte) (tpm.AttestationKey, error) {
	rec := n.state().Identity.TPMAK
	if n.c.TPM == nil {
		return nil, errors.New("the certificate names a TPM AK, and no TPM is open: set tpm in config.toml; renewal fails until then")
	}
	if len(rec) == 0 {
		return nil, errors.New("the certificate names a TPM AK, and identity.json has no AK record; join again: " + identity.WayBack("tpm"))
	}
	r, err := tpm.ParseKeyRecord(rec)
	if err != nil {
		return nil, fmt.Errorf("read the AK record: %w", err)
	}
	ak, err := n.c.TPM.LoadAK(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("load the AK the certificate names (was the TPM cleared or replaced?): %w", err)
	}
	if !bytes.Equal(ak.Name(), name) {
		ak.Close()
		return nil, fmt.Errorf("the TPM derives AK %x, the certificate names %x: was the TPM cleared? renewal fails; join again: %s", ak.Name(), name, identity.WayBack("tpm"))
	}
	return ak, nil
}

// dropPrevious unloads the key before the last renewal, if still held.
func (n *node) dropPrevious() {
	n.mu.Lock()
	prev := n.prev
	n.prev = nil
	n.mu.Unlock()
	closeKey(prev)
}

func closeKey(k crypto.Signer) {
	if c, ok := k.(io.Closer); ok && k != nil {
		_ = c.Close()
	}
}

// finishRenewal checks the answer and stores it in the seed's order
// (steps 4–5), then switches to the new key.
func (n *node) finishRenewal(ctx context.Context, r *renewal, signed *joinv1.SignedJoinResult) error {
	st := n.state()
	id := st.Identity
	opened, err := joinresponse.Open(signed, joinresponse.Expect{
		SigningKeyPin: n.c.Pins.JoinSigning,
		CSRSHA256:     r.csrHash,
		PublicKey:     r.key.Public(),
		TrustDomain:   id.TrustDomain,
		NodeID:        id.NodeID,
		Role:          id.Role,
		Now:           n.c.Now(),
	})
	if err != nil {
		return fmt.Errorf("check the renewal: %w", err)
	}
	res := opened.Result
	if res.Site != id.Site {
		return fmt.Errorf("check the renewal: site %q, want %q", res.Site, id.Site)
	}
	next := id
	next.Chain, next.Roots = res.Chain, res.Roots
	next.Generation = res.IdentityGeneration
	next.ServerTime = time.Unix(0, res.ServerTimeUnixNano).UTC()
	next.RenewedAt = n.c.Now().UTC()
	next.KeyKind = r.keyKind
	if err := identity.StoreRenewal(n.c.DataDir, next, r.keyPEM, n.c.AfterStore); err != nil {
		return fmt.Errorf("store the renewal: %w", err)
	}
	newState := &identity.State{Dir: st.Dir, Identity: next, Leaf: opened.Leaf, Chain: opened.Chain, Roots: opened.Roots, Key: r.key}
	old := st.Key
	n.setState(newState)
	if n.c.OnRenew != nil {
		n.c.OnRenew(newState)
	}
	n.mu.Lock()
	n.prev = old
	n.mu.Unlock()
	// Unload the old key once nothing can still be signing with it (a
	// TPM-held key frees its handle when closed).
	time.AfterFunc(n.c.OldKeyGrace, func() {
		n.mu.Lock()
		drop := n.prev == old
		if drop {
			n.prev = nil
		}
		n.mu.Unlock()
		if drop {
			closeKey(old)
		}
	})
	n.attempt, n.backoff, n.lastErr = 0, 0, nil
	n.nextRenew = n.renewTime()
	keyPin, _ := pki.PinOf(r.key.Public())
	n.log.InfoContext(ctx, "renewed", logkey.Serial, pki.SerialHex(opened.Leaf), "key", keyPin.String(),
		"not_after", opened.Leaf.NotAfter.UTC().Format(time.RFC3339), "next_renewal", n.nextRenew.UTC().Format(time.RFC3339))
	n.journal(ctx, JournalRenewed, fmt.Sprintf("serial %s until %s", pki.SerialHex(opened.Leaf), opened.Leaf.NotAfter.UTC().Format(time.RFC3339)))
	return nil
}

// renewalFailed logs a failure and schedules the next attempt: exactly
// after pushback when the server gave one, else with backoff.
func (n *node) renewalFailed(ctx context.Context, err error, pushback time.Duration) {
	n.attempt++
	wait := pushback
	if wait <= 0 {
		if n.backoff == 0 {
			n.backoff = n.c.BackoffMin
		} else {
			n.backoff = min(n.backoff*2, n.c.BackoffMax)
		}
		wait = n.backoff
	}
	expiresIn := n.state().Leaf.NotAfter.Sub(n.c.Now()).Round(time.Second)
	n.log.WarnContext(ctx, "renewal failed", "attempt", n.attempt, "expiresIn", expiresIn.String(), "retry_in", wait.String(), logkey.Error, err)
	n.journal(ctx, JournalRenewalFailed, fmt.Sprintf("attempt %d: %v", n.attempt, err))
	n.lastErr = err
	n.nextRenew = n.c.Now().Add(wait)
	// Look again right after the certificate expires, not a whole
	// backoff later: then the agent stops with the way back.
	if notAfter := n.state().Leaf.NotAfter; n.nextRenew.After(notAfter) {
		n.nextRenew = notAfter.Add(time.Millisecond)
	}
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
