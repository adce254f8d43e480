package service

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// serveOnLoopback serves s on loopback until the test ends and returns
// its address.
func serveOnLoopback(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// framedClient dials a framed session with cert (nil: none) and returns
// it and its TLS connection.
func framedClient(t *testing.T, s *Server, addr string, cert *tls.Certificate) (*sessionframe.Client, *tls.Conn) {
	t.Helper()
	tc := tlspin.Client(s.cfg.Authority.Bundle.ServingCASPKIPin, s.cfg.Authority.ServingCert.Leaf.DNSNames[0], func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if cert == nil {
			return &tls.Certificate{}, nil
		}
		return cert, nil
	})
	tc.NextProtos = []string{sessionframe.ALPN}
	nc, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	if p := nc.ConnectionState().NegotiatedProtocol; p != sessionframe.ALPN {
		t.Fatalf("negotiated %q, want %q", p, sessionframe.ALPN)
	}
	c := sessionframe.NewClient(nc, time.Second)
	t.Cleanup(func() { c.Close() })
	return c, nc
}

func nodeCert(t *testing.T, n *benchNode) *tls.Certificate {
	t.Helper()
	leaf, err := x509.ParseCertificate(n.chain[0])
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: n.chain, PrivateKey: n.key, Leaf: leaf}
}

func TestFramedSessionRefusals(t *testing.T) {
	s := testServer(t, Config{RenewalLimit: 100, Limits: Limits{HandshakeTimeout: 300 * time.Millisecond}})
	addr := serveOnLoopback(t, s)
	nodes := joinNodes(t, s, 3)

	t.Run("without a node certificate the session ends unauthenticated", func(t *testing.T) {
		c, _ := framedClient(t, s, addr, nil)
		_ = c.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "a"}}})
		if _, err := c.Recv(); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("got %v, want UNAUTHENTICATED", err)
		}
	})
	t.Run("a node that sends no Hello within the handshake timeout is dropped", func(t *testing.T) {
		c, _ := framedClient(t, s, addr, nodeCert(t, nodes[0]))
		if _, err := c.Recv(); status.Code(err) != codes.Unavailable {
			t.Fatalf("got %v, want the connection closed (UNAVAILABLE)", err)
		}
		if s.sessions.count() != 0 {
			t.Fatalf("%d sessions registered, want none", s.sessions.count())
		}
	})
	t.Run("a first message that is not Hello is refused", func(t *testing.T) {
		c, _ := framedClient(t, s, addr, nodeCert(t, nodes[1]))
		_ = c.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Ping{Ping: &gatewayv1.Ping{}}})
		if _, err := c.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("got %v, want INVALID_ARGUMENT", err)
		}
	})
	t.Run("a frame over the bound ends the session and is counted", func(t *testing.T) {
		c, raw := framedClient(t, s, addr, nodeCert(t, nodes[2]))
		if err := c.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "big"}}}); err != nil {
			t.Fatal(err)
		}
		if m, err := c.Recv(); err != nil || m.GetWelcome() == nil {
			t.Fatalf("welcome: %v %v", m, err)
		}
		// A hand-made header: the client's Send refuses such a frame.
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], sessionframe.MaxFrame+1)
		if _, err := raw.Write(hdr[:]); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("got %v, want RESOURCE_EXHAUSTED", err)
		}
		if n := testutil.ToFloat64(s.metrics.oversized.WithLabelValues(gatewayv1.Gateway_Session_FullMethodName)); n != 1 {
			t.Fatalf("oversized session frames counted %v, want 1", n)
		}
		waitFor(t, "the session to leave the registry", func() bool { return s.sessions.count() == 0 })
	})
}

// waitFor polls cond (the registry has no signal of its own) up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFramedSessionThatCannotBeWrittenToEnds(t *testing.T) {
	framedWriteTimeout = 200 * time.Millisecond
	t.Cleanup(func() { framedWriteTimeout = 10 * time.Second })
	s := testServer(t, Config{RenewalLimit: 100})
	addr := serveOnLoopback(t, s)
	n := joinNodes(t, s, 1)[0]
	c, _ := framedClient(t, s, addr, nodeCert(t, n))
	if err := c.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "stalled"}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := c.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("welcome: %v %v", m, err)
	}
	// The node reads nothing more; the server writes until the socket
	// buffers are full and a write passes its deadline.
	sess := s.sessions.get(n.caller.node.ID)
	if sess == nil {
		t.Fatal("no session registered")
	}
	big := &gatewayv1.RevokedCerts{}
	for i := range 4000 {
		big.Certs = append(big.Certs, &gatewayv1.RevokedCert{NodeId: strings.Repeat("n", 64), Serial: fmt.Sprintf("%064x", i)})
	}
	var err error
	for i := 0; i < 200 && err == nil; i++ {
		err = sess.send(&gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_RevokedCerts{RevokedCerts: big}})
	}
	if err == nil {
		t.Fatal("every write succeeded to a node that reads nothing")
	}
	waitFor(t, "the session that cannot be written to to end", func() bool { return s.sessions.count() == 0 })
}
