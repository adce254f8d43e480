package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// PinGuard remembers the last failed check of the server's identity, so a
// caller can tell "the server is not who the pin says" (final) apart from
// "the server is unreachable" (worth a retry): gRPC reports both as
// UNAVAILABLE.
type PinGuard struct{ err atomic.Pointer[error] }

// Err returns the last pin or certificate failure, or nil.
func (g *PinGuard) Err() error {
	if p := g.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Endpoints are the control-plane addresses a connection uses: those the
// node was configured with, and those the control plane's well-known
// document names. Every replica presents the same serving certificate,
// checked against the same pin, whichever address answers.
type Endpoints struct {
	r    *manual.Resolver
	mu   sync.Mutex
	addr []string
}

// Add adds addresses the connection does not have yet; later connections
// may use them.
func (e *Endpoints) Add(addrs ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.addr)
	for _, a := range addrs {
		if a != "" && !slices.Contains(e.addr, a) {
			e.addr = append(e.addr, a)
		}
	}
	if len(e.addr) != n {
		e.r.UpdateState(e.state())
	}
}

// List returns the addresses.
func (e *Endpoints) List() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.addr)
}

func (e *Endpoints) state() resolver.State {
	s := resolver.State{}
	for _, a := range e.addr {
		s.Addresses = append(s.Addresses, resolver.Address{Addr: a})
	}
	return s
}

// serviceConfig has the connection use one control-plane address at a
// time, picked in random order so that nodes spread over the replicas, and
// move to another when it fails.
const serviceConfig = `{"loadBalancingConfig": [{"pick_first": {"shuffleAddressList": true}}]}`

// Dial opens a gRPC client connection to the control plane over TLS
// pinned to the serving CA. servers are its addresses (host:port): the
// connection uses one, and moves to another when that one fails (a
// replica down), for every call and stream. The connection is made lazily
// by the first call; a server that fails the pin check fails that call
// before any request message is sent, and the returned guard holds the
// reason. getCert supplies a client certificate, or nil.
func Dial(servers []string, serverName string, servingCA pki.Pin, getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)) (*grpc.ClientConn, *PinGuard, *Endpoints, error) {
	if len(servers) == 0 {
		return nil, nil, nil, errors.New("dial control plane: no address (set server in config.toml)")
	}
	tc, guard := clientTLS(serverName, servingCA, getCert)
	ep := &Endpoints{r: manual.NewBuilderWithScheme("nodetrust-cp")}
	ep.Add(servers...)
	ep.r.InitialState(ep.state())
	conn, err := grpc.NewClient(ep.r.Scheme()+":///control-plane",
		grpc.WithResolvers(ep.r),
		grpc.WithDefaultServiceConfig(serviceConfig),
		grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dial control plane %v: %w", servers, err)
	}
	return conn, guard, ep, nil
}

// clientTLS is the TLS client configuration of every connection to the
// control plane: the serving certificate checked against the pin, getCert
// asked for the client certificate at each handshake (so a reconnect
// after a renewal presents the new one), and a guard that remembers a
// failed pin check.
func clientTLS(serverName string, servingCA pki.Pin, getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)) (*tls.Config, *PinGuard) {
	tc := tlspin.Client(servingCA, serverName, getCert)
	guard := &PinGuard{}
	verify := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		err := verify(cs)
		if err != nil {
			guard.err.Store(&err)
		}
		return err
	}
	return tc, guard
}
