package agent

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

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

// Dial opens a gRPC client connection to the control plane over TLS
// pinned to the serving CA. The connection is made lazily by the first
// call; a server that fails the pin check fails that call before any
// request message is sent, and the returned guard holds the reason.
// getCert supplies a client certificate, or nil.
func Dial(server, serverName string, servingCA pki.Pin, getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)) (*grpc.ClientConn, *PinGuard, error) {
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
	conn, err := grpc.NewClient("passthrough:///"+server, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, nil, fmt.Errorf("dial control plane %s: %w", server, err)
	}
	return conn, guard, nil
}
