package sessionframe

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"math/big"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
)

// testTLS makes a server and a client TLS configuration that trust one
// self-signed certificate.
func testTLS(t *testing.T, serverProtos ...string) (srv, cli *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"fleetd"}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	srv = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: serverProtos}
	cli = &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "fleetd"}
	return srv, cli
}

// serve accepts one TLS connection on a loopback listener and hands it,
// handshaken, to fn.
func serve(t *testing.T, cfg *tls.Config, fn func(*tls.Conn)) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return
		}
		fn(tc)
	}()
	return ln.Addr().String()
}

func TestFramedSessionRoundTripAndEnd(t *testing.T) {
	srvCfg, cliCfg := testTLS(t, ALPN, "h2")
	const n = 50
	addr := serve(t, srvCfg, func(c *tls.Conn) {
		if p := c.ConnectionState().NegotiatedProtocol; p != ALPN {
			t.Errorf("server negotiated %q", p)
		}
		s := NewServer(c, time.Second)
		hello, err := s.Recv()
		if err != nil || hello.GetHello().GetInstanceId() != "i-1" {
			t.Errorf("hello: %v %v", hello, err)
			return
		}
		// Many writers at once: each frame must arrive whole.
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = s.Send(&gatewayv1.SessionResponse{Id: uint64(i + 1), Body: &gatewayv1.SessionResponse_Pong{Pong: &gatewayv1.Pong{ServerTimeUnixNano: int64(i)}}})
			}()
		}
		wg.Wait()
		s.End(status.Error(codes.Unavailable, "the store failed; retry"), 5000)
		s.End(errors.New("a second End does nothing"), 0)
	})
	c, err := Dial(context.Background(), addr, cliCfg, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "i-1"}}}); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for range n {
		m, err := c.Recv()
		if err != nil {
			t.Fatalf("frame %d: %v", len(seen), err)
		}
		if m.GetPong() == nil || m.GetPong().ServerTimeUnixNano != int64(m.Id-1) {
			t.Fatalf("frame garbled: %v", m)
		}
		seen[m.Id] = true
	}
	if len(seen) != n {
		t.Fatalf("got %d distinct frames, want %d", len(seen), n)
	}
	_, err = c.Recv()
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "the store failed; retry" {
		t.Fatalf("end: got %v, want the server's Unavailable status", err)
	}
	var end *EndError
	if !errors.As(err, &end) || end.RetryPushback != 5*time.Second {
		t.Fatalf("end: got %#v, want an EndError with the server's pushback of 5s", err)
	}
}

func TestDialFallsBackWhenNotOffered(t *testing.T) {
	srvCfg, cliCfg := testTLS(t, "h2")
	addr := serve(t, srvCfg, func(c *tls.Conn) { c.Close() })
	_, err := Dial(context.Background(), addr, cliCfg, time.Second)
	if !errors.Is(err, ErrNotOffered) {
		t.Fatalf("got %v, want ErrNotOffered", err)
	}
}

func TestOversizedFrameRefused(t *testing.T) {
	srvCfg, cliCfg := testTLS(t, ALPN)
	got := make(chan error, 1)
	addr := serve(t, srvCfg, func(c *tls.Conn) {
		_, err := NewServer(c, time.Second).Recv()
		got <- err
		c.Close()
	})
	c, err := Dial(context.Background(), addr, cliCfg, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var hdr [headerLen]byte
	binary.BigEndian.PutUint32(hdr[:], MaxFrame+1)
	if _, err := c.c.nc.Write(hdr[:]); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("server read %v, want ErrFrameTooLarge", err)
	}
	// The client's own Send refuses a message over the bound before
	// writing anything.
	big := &gatewayv1.SessionRequest{Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{DaemonVersion: string(make([]byte, MaxFrame))}}}
	if err := c.Send(big); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("send: got %v, want ErrFrameTooLarge", err)
	}
}

func TestConnectionLostIsUnavailable(t *testing.T) {
	srvCfg, cliCfg := testTLS(t, ALPN)
	addr := serve(t, srvCfg, func(c *tls.Conn) { c.Close() })
	c, err := Dial(context.Background(), addr, cliCfg, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Recv(); status.Code(err) != codes.Unavailable || errors.Is(err, io.EOF) {
		t.Fatalf("got %v, want Unavailable", err)
	}
}

func TestDialSendsTheLeafAlone(t *testing.T) {
	srvCfg, cliCfg := testTLS(t, ALPN)
	srvCfg.ClientAuth = tls.RequireAnyClientCert
	got := make(chan int, 1)
	addr := serve(t, srvCfg, func(c *tls.Conn) {
		got <- len(c.ConnectionState().PeerCertificates)
		c.Close()
	})
	// Any two certificates: the server only counts them.
	chain := srvCfg.Certificates[0]
	chain.Certificate = [][]byte{chain.Certificate[0], chain.Certificate[0]}
	cliCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &chain, nil }
	c, err := Dial(context.Background(), addr, cliCfg, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := <-got; n != 1 {
		t.Fatalf("the server got %d certificates, want the leaf alone", n)
	}
	if len(chain.Certificate) != 2 {
		t.Fatal("Dial changed the caller's certificate")
	}
}
