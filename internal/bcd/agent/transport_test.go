package agent_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
)

// olderFleetd serves cp as a fleetd older than the framed session answers
// a node: a connection that asks for the framed session alone meets Go's
// TLS server with fleetd's serving configuration as it was (h2 its only
// application protocol), which refuses the handshake at the ClientHello
// (no_application_protocol); every other connection is passed, bytes
// unchanged, to cp's server, so its TLS and gRPC are the real ones. It
// returns the address to give the node, and a switch that upgrades it:
// from then on every connection is passed on.
func (cp *controlPlane) olderFleetd(t *testing.T) (string, *atomic.Bool) {
	t.Helper()
	old := cp.srv.TLSConfig()
	old.NextProtos = []string{"h2"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upgraded := &atomic.Bool{}
	// The real server keeps its address across restarts; read it once
	// (restart writes cp.addr again while connections are passed on).
	backend := cp.addr
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				frontOlder(c, backend, old, upgraded)
			}()
		}
	}()
	return ln.Addr().String(), upgraded
}

// errPassOn stops the TLS server that reads a ClientHello meant for the
// real server.
var errPassOn = errors.New("not a framed session: pass it on")

// frontOlder answers one connection as olderFleetd says, passing it on to
// backend.
func frontOlder(c net.Conn, backend string, old *tls.Config, upgraded *atomic.Bool) {
	defer c.Close()
	rc := &recordingConn{Conn: c, mute: true}
	refuse := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		if !upgraded.Load() && slices.Equal(h.SupportedProtos, []string{sessionframe.ALPN}) {
			rc.mute = false
			return old, nil
		}
		return nil, errPassOn
	}}
	if err := tls.Server(rc, refuse).Handshake(); !errors.Is(err, errPassOn) {
		return // refused, as an older fleetd does
	}
	back, err := net.Dial("tcp", backend)
	if err != nil {
		return
	}
	defer back.Close()
	if _, err := back.Write(rc.read.Bytes()); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, back)
		c.Close()
		close(done)
	}()
	_, _ = io.Copy(back, c)
	back.Close()
	<-done
}

// recordingConn keeps what is read from it, and drops what is written
// while mute (the alert of a TLS server stopped to pass the connection on).
type recordingConn struct {
	net.Conn
	read bytes.Buffer
	mute bool
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Write(p[:n])
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) {
	if c.mute {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// TestSessionFallsBackToGRPCAtAnOlderControlPlane runs the agent, framed
// session by default, against a fleetd that does not offer it (see
// olderFleetd): the session goes over gRPC, and there the renewal, the
// reconnect after a restart and the revocation all happen as before.
func TestSessionFallsBackToGRPCAtAnOlderControlPlane(t *testing.T) {
	cp := startControlPlane(t)
	dir, st := cp.joinNode(t, true)
	w := newWatch()
	c := cp.nodeConfig(dir, w)
	older, _ := cp.olderFleetd(t)
	c.Servers = []string{older}
	r := runNode(t, c)

	w.sessionOpen(t)
	if e := w.next(t); e.kind != agent.JournalRenewed || e.nodeID != st.Identity.NodeID {
		t.Fatalf("journal %+v, want %s renewed", e, st.Identity.NodeID)
	}
	renewed := load(t, dir)
	if serialOf(renewed) == serialOf(st) {
		t.Fatal("identity.json still holds the joined certificate after the renewal")
	}

	// The reconnect tries the framed session again and falls back again;
	// the new session presents the renewed certificate.
	cp.restart(t)
	w.sessionOpen(t)
	if got, want := w.sessionTransports(), []string{agent.TransportGRPC, agent.TransportGRPC}; !slices.Equal(got, want) {
		t.Errorf("sessions over %q, want %q", got, want)
	}
	node, err := cp.db.GetNode(t.Context(), st.Identity.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if node.CertSerial != serialOf(renewed) {
		t.Errorf("the control plane's current serial is %s, want the renewed %s", node.CertSerial, serialOf(renewed))
	}

	revokeAndWait(t, cp, r, w, st.Identity.NodeID, "fallback")
}

// TestSessionIsFramedAtAControlPlaneThatOffersIt: the renewal and the
// revocation travel on the framed session.
func TestSessionIsFramedAtAControlPlaneThatOffersIt(t *testing.T) {
	cp := startControlPlane(t)
	dir, st := cp.joinNode(t, true)
	w := newWatch()
	r := runNode(t, cp.nodeConfig(dir, w))
	w.sessionOpen(t)
	if e := w.next(t); e.kind != agent.JournalRenewed {
		t.Fatalf("journal %+v, want the renewal", e)
	}
	if got := w.sessionTransports(); !slices.Equal(got, []string{agent.TransportFramed}) {
		t.Errorf("sessions over %q, want framed", got)
	}
	revokeAndWait(t, cp, r, w, st.Identity.NodeID, "framed")
}

// TestSessionBecomesFramedOnceTheControlPlaneIsUpgraded: the fallback is
// not remembered; the session after an upgrade's restart is framed.
func TestSessionBecomesFramedOnceTheControlPlaneIsUpgraded(t *testing.T) {
	cp := startControlPlane(t)
	dir, _ := cp.joinNode(t, false)
	w := newWatch()
	c := cp.nodeConfig(dir, w)
	older, upgraded := cp.olderFleetd(t)
	c.Servers = []string{older}
	r := runNode(t, c)
	w.sessionOpen(t)
	upgraded.Store(true)
	cp.restart(t)
	w.sessionOpen(t)
	if err := r.stop(t); err != nil {
		t.Fatalf("RunNode = %v after its context ended, want nil", err)
	}
	if got, want := w.sessionTransports(), []string{agent.TransportGRPC, agent.TransportFramed}; !slices.Equal(got, want) {
		t.Errorf("sessions over %q, want %q", got, want)
	}
}

// TestSessionTransportGRPCIsKept: a node configured for the gRPC session
// never tries the framed one, whatever the control plane offers.
func TestSessionTransportGRPCIsKept(t *testing.T) {
	cp := startControlPlane(t)
	dir, _ := cp.joinNode(t, false)
	w := newWatch()
	c := cp.nodeConfig(dir, w)
	c.SessionTransport = agent.TransportGRPC
	r := runNode(t, c)
	w.sessionOpen(t)
	if err := r.stop(t); err != nil {
		t.Fatalf("RunNode = %v after its context ended, want nil", err)
	}
	if got := w.sessionTransports(); !slices.Equal(got, []string{agent.TransportGRPC}) {
		t.Errorf("sessions over %q, want grpc", got)
	}
}

func TestSessionTransportUnknownIsRefused(t *testing.T) {
	err := agent.RunNode(t.Context(), agent.NodeConfig{DataDir: t.TempDir(), SessionTransport: "quic"})
	if err == nil || !strings.Contains(err.Error(), `"quic"`) {
		t.Fatalf("RunNode with session transport quic = %v, want it refused by name", err)
	}
}

// revokeAndWait revokes nodeID through the admin API and checks that its
// live session carried the notice: RunNode ends with ErrRevoked and the
// journal holds the revocation with reason.
func revokeAndWait(t *testing.T, cp *controlPlane, r *running, w *watch, nodeID, reason string) {
	t.Helper()
	resp, err := cp.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: nodeID, Reason: reason})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.SessionNotified {
		t.Error("the control plane found no session to notify")
	}
	if err := r.wait(t); !errors.Is(err, agent.ErrRevoked) {
		t.Fatalf("RunNode = %v, want ErrRevoked", err)
	}
	if e := w.next(t); e.kind != agent.JournalRevoked || e.detail != reason {
		t.Errorf("journal %+v, want the revocation with its reason", e)
	}
}
