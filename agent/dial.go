package agent

import (
	"crypto/tls"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tlspin"
)

// Dial opens a gRPC client connection to the control plane over TLS
// pinned to the serving CA. The connection is made lazily by the first
// call; a server that fails the pin check fails that call before any
// request message is sent. getCert supplies a client certificate, or nil.
func Dial(server, serverName string, servingCA pki.Pin, getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)) (*grpc.ClientConn, error) {
	tc := tlspin.Client(servingCA, serverName, getCert)
	conn, err := grpc.NewClient("passthrough:///"+server, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, fmt.Errorf("dial control plane %s: %w", server, err)
	}
	return conn, nil
}
