package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
)

// Session transports (NodeConfig.SessionTransport).
const (
	// TransportFramed is the framed session (package sessionframe) on
	// its own mutual-TLS connection, falling back to TransportGRPC at a
	// control plane that does not offer it. The default.
	TransportFramed = "framed"
	// TransportGRPC is the Gateway service's Session stream on the gRPC
	// connection, always.
	TransportGRPC = "grpc"
)

// sessionStream is one live session's messages, whichever transport
// carries them: both the gRPC Session stream and the framed session's
// client have this shape, and both end with a gRPC status error.
type sessionStream interface {
	Send(*gatewayv1.SessionRequest) error
	Recv() (*gatewayv1.SessionResponse, error)
}

// framedDialTimeout bounds the framed session's dial to one address (TCP
// and TLS handshake); gRPC's own connection attempt waits 20 s.
const framedDialTimeout = 10 * time.Second

// framedWriteTimeout bounds one write on the framed session: a control
// plane that stops reading fails the session instead of holding it; a
// renewal waits 30 s for its answer too.
const framedWriteTimeout = 30 * time.Second

// sessionDialer opens the agent's live sessions.
type sessionDialer struct {
	gw        gatewayv1.GatewayClient
	endpoints *Endpoints
	// configured is how many of endpoints' addresses the configuration
	// named (the first ones); the others were learned.
	configured int
	// tls is the gRPC connection's TLS configuration (the pin check and
	// the current client certificate); the framed dial replaces its
	// application protocols.
	tls      *tls.Config
	grpcOnly bool
}

// open opens a session. The framed session is tried first at each
// control-plane address, the configured ones before the learned ones,
// each group in random order (so nodes spread over the replicas they were
// given, as the gRPC connection's shuffled pick_first does); the first
// that answers carries it. When an address refuses the protocol (a fleetd older than
// the framed session) and none accepts it, the session goes over gRPC
// instead, on the gRPC connection's own choice of address. That is
// decided afresh at each reconnect, never remembered: a control plane
// upgraded behind a node's back (its restart breaks the session) is
// spoken to in frames from the next session on, and a refusal costs one
// handshake the server ends at its first message. When no address
// answers in frames for any other reason, the gRPC session is tried too
// (it may pass a proxy or middlebox the framed dial cannot); when that
// fails as well, open fails and the caller's reconnect backoff applies.
//
// The returned end function closes the session's transport; it must be
// called once the session is over. The transport also closes when ctx
// ends, so a Recv in progress returns.
func (d *sessionDialer) open(ctx context.Context) (stream sessionStream, transport string, end func(), err error) {
	if !d.grpcOnly {
		addrs := d.endpoints.List()
		// The configured addresses first, then those learned from
		// the well-known document; each group in random order.
		first := min(d.configured, len(addrs))
		for _, g := range [][]string{addrs[:first], addrs[first:]} {
			rand.Shuffle(len(g), func(i, j int) { g[i], g[j] = g[j], g[i] })
		}
		var errs []error
		refused := false
		for _, a := range addrs {
			dctx, cancel := context.WithTimeout(ctx, framedDialTimeout)
			c, err := sessionframe.Dial(dctx, a, d.tls, framedWriteTimeout)
			cancel()
			if err == nil {
				stop := context.AfterFunc(ctx, func() { _ = c.Close() })
				return c, TransportFramed, func() { stop(); _ = c.Close() }, nil
			}
			if ctx.Err() != nil {
				return nil, "", nil, ctx.Err()
			}
			if errors.Is(err, sessionframe.ErrNotOffered) {
				refused = true
				continue
			}
			errs = append(errs, err)
		}
		if !refused && len(errs) > 0 {
			// No address answered in frames. gRPC may still get
			// through where the framed dial cannot (grpc-go honours
			// HTTPS_PROXY; a middlebox may pass only h2): try it
			// rather than let the certificate run out. When it fails
			// too, both reasons are returned.
			sctx, cancel := context.WithCancel(ctx)
			s, err := d.gw.Session(sctx)
			if err != nil {
				cancel()
				return nil, "", nil, fmt.Errorf("open the framed session: %w; and the gRPC session: %w", errors.Join(errs...), err)
			}
			return s, TransportGRPC, cancel, nil
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	s, err := d.gw.Session(sctx)
	if err != nil {
		cancel()
		return nil, "", nil, err
	}
	return s, TransportGRPC, cancel, nil
}
