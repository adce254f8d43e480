package agent_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
)

// TestSessionFallsBackToGRPCAtAnOlderControlPlane runs the agent, framed
// session by default, against a fleetd that does not offer it (its gRPC
// server alone, h2 its only protocol): the session goes over gRPC, and
// there the renewal, the reconnect after a restart and the revocation all
// happen as before.
func TestSessionFallsBackToGRPCAtAnOlderControlPlane(t *testing.T) {
	cp := startControlPlaneOf(t, true)
	dir, st := cp.joinNode(t, true)
	w := newWatch()
	r := runNode(t, cp.nodeConfig(dir, w))

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

	resp, err := cp.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: st.Identity.NodeID, Reason: "fallback"})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.SessionNotified {
		t.Error("the control plane found no session to notify")
	}
	if err := r.wait(t); !errors.Is(err, agent.ErrRevoked) {
		t.Fatalf("RunNode = %v, want ErrRevoked", err)
	}
	if e := w.next(t); e.kind != agent.JournalRevoked || e.detail != "fallback" {
		t.Errorf("journal %+v, want the revocation with its reason", e)
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
