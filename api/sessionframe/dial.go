package sessionframe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// ErrNotOffered is returned by Dial when the server does not speak the
// framed session (an older fleetd): use the gRPC Session instead.
var ErrNotOffered = errors.New("the control plane does not offer the framed session")

// Keepalive is the TCP keepalive both ends set on a framed session: a
// peer that vanished (a reboot sends no FIN) is found within about two
// minutes, by the kernel, with no goroutine and no timer in the process.
var Keepalive = net.KeepAliveConfig{Enable: true, Idle: 60 * time.Second, Interval: 15 * time.Second, Count: 4}

// Dial opens a framed session's connection to addr with tc (a node's
// mutual-TLS client configuration; its NextProtos are replaced by ALPN).
// It returns ErrNotOffered, wrapped, when the server refuses the protocol.
//
// Of the client certificate's chain Dial sends the leaf alone: fleetd
// trusts the node CA directly, and every certificate a client sends is
// parsed and kept by the server's TLS for the connection's life — an
// intermediate would cost each held session some 4 KiB of server memory
// for nothing.
func Dial(ctx context.Context, addr string, tc *tls.Config, writeTimeout time.Duration) (*Client, error) {
	tc = tc.Clone()
	tc.NextProtos = []string{ALPN}
	if get := tc.GetClientCertificate; get != nil {
		tc.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := get(cri)
			if err != nil || c == nil || len(c.Certificate) < 2 {
				return c, err
			}
			leaf := *c
			leaf.Certificate = c.Certificate[:1]
			return &leaf, nil
		}
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{KeepAliveConfig: Keepalive}, Config: tc}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		// Go's server answers an unknown protocol with the
		// no_application_protocol alert, which reaches the client only
		// as its text.
		if strings.Contains(err.Error(), "no application protocol") {
			return nil, fmt.Errorf("%w at %s: %v", ErrNotOffered, addr, err)
		}
		return nil, err
	}
	tcn := nc.(*tls.Conn)
	if p := tcn.ConnectionState().NegotiatedProtocol; p != ALPN {
		_ = nc.Close()
		return nil, fmt.Errorf("%w at %s: it chose protocol %q", ErrNotOffered, addr, p)
	}
	return NewClient(nc, writeTimeout), nil
}
