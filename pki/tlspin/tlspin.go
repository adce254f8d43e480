package tlspin

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/nodetrust/nodetrust/pki"
)

// ErrUntrusted means the server is not the one the pin names: every
// failure of [Verify] wraps it, so a caller can tell "this is not my
// control plane" (final: the pins or the server are wrong) from "the
// control plane cannot be reached" (worth a retry).
var ErrUntrusted = errors.New("untrusted server")

// ErrPinMismatch means no certificate the server presented has the pinned
// public key. It wraps [ErrUntrusted].
var ErrPinMismatch = fmt.Errorf("%w: the server's certificate chain does not contain the pinned serving CA", ErrUntrusted)

// Client returns a TLS 1.3 client configuration that accepts a server only
// if its chain contains a CA certificate whose public key has pin and the
// leaf chains to that CA and is valid for serverName. getCert, when not
// nil, supplies the client certificate (mutual TLS).
func Client(pin pki.Pin, serverName string, getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: serverName,
		// Verification is done by VerifyConnection against the pin alone.
		InsecureSkipVerify:   true,
		VerifyConnection:     func(cs tls.ConnectionState) error { return Verify(cs.PeerCertificates, pin, serverName) },
		GetClientCertificate: getCert,
	}
}

// Verify checks a presented chain (leaf first) against pin and serverName.
// Every failure wraps [ErrUntrusted].
func Verify(chain []*x509.Certificate, pin pki.Pin, serverName string) error {
	if len(chain) == 0 {
		return fmt.Errorf("%w: the server presented no certificate", ErrUntrusted)
	}
	var anchor *x509.Certificate
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		if anchor == nil && pki.PinOfCert(c) == pin {
			anchor = c
			continue
		}
		inter.AddCert(c)
	}
	if anchor == nil {
		return fmt.Errorf("%w (pin %s); check serving_ca_spki_pin against the control plane's pki-bundle.json", ErrPinMismatch, pin)
	}
	roots := x509.NewCertPool()
	roots.AddCert(anchor)
	_, err := chain[0].Verify(x509.VerifyOptions{
		DNSName:       serverName,
		Roots:         roots,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("%w: verify the server's certificate for %q under the pinned serving CA: %w", ErrUntrusted, serverName, err)
	}
	return nil
}
