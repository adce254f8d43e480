package federation

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"

	"github.com/nodetrust/nodetrust/pki"
)

// ServerTLS returns the TLS configuration of the federation listener: the
// machine certificate as server certificate, reloaded when it renews. It
// asks for no client certificate: each call carries its machine proof.
func (m *Machine) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c := m.current()
			if c == nil {
				return nil, ErrNoCertificate
			}
			return c.tlsCert, nil
		},
	}
}

// ClientTLS returns the TLS configuration of a call to the daemon of node:
// its server certificate must be the node certificate of node, of this
// daemon's trust domain, chaining to this daemon's roots.
func (m *Machine) ClientTLS(node string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: node,
		// The server's certificate names a node by URI SAN, not a host,
		// so VerifyConnection checks it instead of the default check.
		InsecureSkipVerify: true, //nolint:gosec // verified by VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			return m.VerifyServer(cs.PeerCertificates, node)
		},
	}
}

// VerifyServer checks the certificate chain a daemon's federation listener
// presents: it verifies to this daemon's roots for server authentication,
// and its leaf is the node certificate of node in this daemon's trust
// domain.
func (m *Machine) VerifyServer(certs []*x509.Certificate, node string) error {
	c := m.current()
	if c == nil {
		return fmt.Errorf("%w to check node %q by", ErrNoCertificate, node)
	}
	if len(certs) == 0 {
		return fmt.Errorf("the daemon of node %q presented no certificate", node)
	}
	inter := x509.NewCertPool()
	for _, ic := range certs[1:] {
		inter.AddCert(ic)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         c.roots,
		Intermediates: inter,
		CurrentTime:   m.now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return fmt.Errorf("the certificate of the daemon called as node %q does not verify against this daemon's CA: %w", node, err)
	}
	info, err := pki.ParseNodeCert(certs[0])
	if err != nil {
		return fmt.Errorf("the daemon called as node %q: %w", node, err)
	}
	switch {
	case info.TrustDomain != c.trustDomain:
		return fmt.Errorf("the daemon called as node %q is of trust domain %q, not %q", node, info.TrustDomain, c.trustDomain)
	case info.NodeID != node:
		return fmt.Errorf("the daemon called as node %q is node %q: check the address of %q in the launch file or config.toml", node, info.NodeID, node)
	}
	return nil
}
