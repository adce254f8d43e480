package service_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
)

// openSession opens a session as process instance and returns it once
// the server welcomed it (the session is then registered).
func openSession(t *testing.T, gw gatewayv1.GatewayClient, instance string) (gatewayv1.Gateway_SessionClient, *gatewayv1.Welcome) {
	t.Helper()
	stream, err := gw.Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{DaemonVersion: "test", InstanceId: instance}}}); err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil {
		t.Fatalf("session of %s: %v", instance, err)
	}
	w := m.GetWelcome()
	if w == nil || m.Id != 1 {
		t.Fatalf("first answer %v, want a welcome to request 1", m)
	}
	return stream, w
}

// call sends one request on a session and returns the answer to it.
func call(t *testing.T, s gatewayv1.Gateway_SessionClient, req *gatewayv1.SessionRequest) *gatewayv1.SessionResponse {
	t.Helper()
	if err := s.Send(req); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("answer to request %d: %v", req.Id, err)
	}
	if m.Id != req.Id {
		t.Fatalf("answer to request %d has id %d", req.Id, m.Id)
	}
	return m
}

func TestSessionStartsWithHello(t *testing.T) { overBothTransports(t, testSessionStartsWithHello) }

func testSessionStartsWithHello(t *testing.T, grpcSessions bool) {
	cases := []struct {
		name  string
		first *gatewayv1.SessionRequest
	}{
		{name: "a ping before the hello", first: &gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Ping{Ping: &gatewayv1.Ping{}}}},
		{name: "a hello without an instance id", first: &gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{}}}},
		{name: "a hello with an instance id of 65 bytes", first: &gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: strings.Repeat("a", 65)}}}},
	}
	e := newEnv(t)
	e.grpcSessions = grpcSessions
	n := e.newNode(t, "web")
	_, gw := e.nodeClients(t, n)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := gw.Session(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(tc.first); err != nil {
				t.Fatal(err)
			}
			_, err = stream.Recv()
			wantStatus(t, err, codes.InvalidArgument, "a session starts with Hello naming the process's instance id")
		})
	}
}

func TestSessionRefusesDeadCertificates(t *testing.T) {
	overBothTransports(t, testSessionRefusesDeadCertificates)
}

func testSessionRefusesDeadCertificates(t *testing.T, grpcSessions bool) {
	cases := []struct {
		name string
		kill func(t *testing.T, e *env, n *node)
		code codes.Code
		msg  string
		// pushback is the grpc-retry-pushback-ms the session ends
		// with (the gRPC trailer, or the framed SessionEnd's field).
		pushback string
	}{
		{
			name: "a revoked certificate",
			kill: func(t *testing.T, e *env, n *node) {
				if _, err := e.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: n.id, Reason: "disk stolen"}); err != nil {
					t.Fatal(err)
				}
			},
			code: codes.Unauthenticated, msg: "node certificate refused: certificate %s was revoked (disk stolen)",
		},
		{
			name: "the certificate of a deleted node",
			kill: func(t *testing.T, e *env, n *node) {
				if _, err := e.admin.DeleteNode(t.Context(), &adminv1.DeleteNodeRequest{Id: n.id}); err != nil {
					t.Fatal(err)
				}
			},
			code: codes.Unauthenticated, msg: "node certificate refused: certificate %s was revoked (node deleted)",
		},
		{
			name: "the certificate of a node another machine reclaimed",
			kill: func(t *testing.T, e *env, n *node) {
				secret, _ := e.token(t, &adminv1.CreateTokenRequest{Role: "worker", NodeId: n.id, AllowReclaim: true})
				m := newMachine(t, "web")
				e.mustJoin(t, m, e.request(t, m, secret))
			},
			code: codes.Unauthenticated, msg: "node certificate refused: certificate %s was revoked (reclaimed)",
		},
		{
			name: "a certificate the store cannot check",
			kill: func(t *testing.T, e *env, n *node) { e.store.FailNext("GetCert", storefault.ErrInjected) },
			code: codes.Unavailable, msg: "get certificate: the store failed; retry",
		},
		{
			name: "a certificate the store cannot be reached to check",
			kill: func(t *testing.T, e *env, n *node) {
				e.store.FailNext("GetCert", fmt.Errorf("%w: connection refused", store.ErrUnavailable))
			},
			code: codes.Unavailable, msg: "get certificate: the store failed; retry", pushback: "5000",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.grpcSessions = grpcSessions
			n := e.newNode(t, "web")
			tc.kill(t, e, n)
			_, gw := e.nodeClients(t, n)
			stream, err := gw.Session(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			_ = stream.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "proc"}}})
			_, err = stream.Recv()
			wantStatus(t, err, tc.code, strings.Replace(tc.msg, "%s", n.serial(), 1))
			e.wantFired(t)
			if got := endPushback(t, stream, err); got != tc.pushback {
				t.Errorf("the session ended with pushback %q ms, want %q", got, tc.pushback)
			}
		})
	}
}

func TestSessionAnswersPingsAndRenewals(t *testing.T) {
	overBothTransports(t, testSessionAnswersPingsAndRenewals)
}

func testSessionAnswersPingsAndRenewals(t *testing.T, grpcSessions bool) {
	e := newEnv(t, func(c *service.Config) { c.RenewalLimit = 2 })
	e.grpcSessions = grpcSessions
	n := e.newNode(t, "web")
	_, gw := e.nodeClients(t, n)
	stream, w := openSession(t, gw, "proc-a")
	if w.NodeId != "web" || w.ServerTimeUnixNano != e.clock.Now().UnixNano() {
		t.Fatalf("welcome %v, want node web and the server's time", w)
	}

	t.Run("a ping is answered with the server's time", func(t *testing.T) {
		m := call(t, stream, &gatewayv1.SessionRequest{Id: 2, Body: &gatewayv1.SessionRequest_Ping{Ping: &gatewayv1.Ping{}}})
		if m.GetPong().GetServerTimeUnixNano() != e.clock.Now().UnixNano() {
			t.Fatalf("answer %v, want a pong with the server's time", m)
		}
	})
	t.Run("a second hello is an error that leaves the session open", func(t *testing.T) {
		m := call(t, stream, &gatewayv1.SessionRequest{Id: 3, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "proc-a"}}})
		if e := m.GetError(); e == nil || codes.Code(e.Code) != codes.InvalidArgument || e.Message != "unexpected message on the session" {
			t.Fatalf("answer %v, want INVALID_ARGUMENT unexpected message", m)
		}
	})
	t.Run("a renewal on the session is answered on it", func(t *testing.T) {
		r := e.renewal(t, n)
		m := call(t, stream, &gatewayv1.SessionRequest{Id: 4, Body: &gatewayv1.SessionRequest_Renew{Renew: r.req}})
		if m.GetRenew() == nil {
			t.Fatalf("answer %v, want a renewal", m)
		}
		n = e.renewed(t, n, r, m.GetRenew().Signed)
	})
	t.Run("the certificate just issued on the session renews without a store look-up of it", func(t *testing.T) {
		certs, nodes := e.store.Calls("GetCert"), e.store.Calls("GetNode")
		r := e.renewal(t, n)
		m := call(t, stream, &gatewayv1.SessionRequest{Id: 5, Body: &gatewayv1.SessionRequest_Renew{Renew: r.req}})
		if m.GetRenew() == nil {
			t.Fatalf("answer %v, want a renewal", m)
		}
		n = e.renewed(t, n, r, m.GetRenew().Signed)
		if e.store.Calls("GetCert") != certs || e.store.Calls("GetNode") != nodes {
			t.Errorf("the renewal looked up %d certificates and %d nodes, want none", e.store.Calls("GetCert")-certs, e.store.Calls("GetNode")-nodes)
		}
	})
	t.Run("a renewal over the limit is an error with the pushback", func(t *testing.T) {
		r := e.renewal(t, n)
		m := call(t, stream, &gatewayv1.SessionRequest{Id: 6, Body: &gatewayv1.SessionRequest_Renew{Renew: r.req}})
		e := m.GetError()
		if e == nil || codes.Code(e.Code) != codes.ResourceExhausted || e.RetryPushbackMs != 3600000 || !strings.Contains(e.Message, "renewed 2 times in 1h0m0s") {
			t.Fatalf("answer %v, want RESOURCE_EXHAUSTED with a pushback of one hour", m)
		}
	})
	t.Run("a store failure during a renewal is an error that leaves the session open", func(t *testing.T) {
		e.clock.Advance(time.Hour) // past the pushback
		e.store.FailNext("RecordRenewalLimited", storefault.ErrInjected)
		r := e.renewal(t, n)
		m := call(t, stream, &gatewayv1.SessionRequest{Id: 7, Body: &gatewayv1.SessionRequest_Renew{Renew: r.req}})
		if er := m.GetError(); er == nil || codes.Code(er.Code) != codes.Unavailable || er.RetryPushbackMs != 0 {
			t.Fatalf("answer %v, want UNAVAILABLE without pushback", m)
		}
		e.wantFired(t)
		m = call(t, stream, &gatewayv1.SessionRequest{Id: 8, Body: &gatewayv1.SessionRequest_Ping{Ping: &gatewayv1.Ping{}}})
		if m.GetPong() == nil {
			t.Fatalf("answer %v after the failure, want a pong", m)
		}
	})
}

func TestRevocationReachesTheLiveSession(t *testing.T) {
	overBothTransports(t, testRevocationReachesTheLiveSession)
}

func testRevocationReachesTheLiveSession(t *testing.T, grpcSessions bool) {
	cases := []struct {
		name       string
		revoke     func(t *testing.T, e *env, id string) (notified bool)
		reason     string
		wantState  string
		wantAction string
	}{
		{
			name: "an admin revocation",
			revoke: func(t *testing.T, e *env, id string) bool {
				resp, err := e.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: id, Reason: "  disk stolen "})
				if err != nil {
					t.Fatal(err)
				}
				if resp.IdentityGeneration != 2 || len(resp.RevokedSerials) != 1 {
					t.Errorf("RevokeNode = %v, want generation 2 and one serial", resp)
				}
				return resp.SessionNotified
			},
			reason: "disk stolen", wantState: store.StateRevoked, wantAction: "node.revoke",
		},
		{
			name: "a deletion",
			revoke: func(t *testing.T, e *env, id string) bool {
				resp, err := e.admin.DeleteNode(t.Context(), &adminv1.DeleteNodeRequest{Id: id})
				if err != nil {
					t.Fatal(err)
				}
				return resp.SessionNotified
			},
			reason: "node deleted", wantAction: "node.delete",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.grpcSessions = grpcSessions
			n := e.newNode(t, "web")
			_, gw := e.nodeClients(t, n)
			stream, _ := openSession(t, gw, "proc-a")
			if !tc.revoke(t, e, n.id) {
				t.Error("the revocation says no session was notified")
			}
			m, err := stream.Recv()
			if err != nil {
				t.Fatalf("Recv: %v, want a revocation notice", err)
			}
			if r := m.GetRevoked(); r == nil || r.Reason != tc.reason {
				t.Fatalf("message %v, want a revocation notice for %q", m, tc.reason)
			}
			if g := m.GetRevoked().GetIdentityGeneration(); g != 2 {
				t.Errorf("the notice names generation %d, want 2: the one the node was revoked at", g)
			}
			_, err = stream.Recv()
			wantStatus(t, err, codes.Unauthenticated, "certificate revoked: "+tc.reason)
			if a := e.audit(t, tc.wantAction); len(a) != 1 || a[0].Actor != "admin:owner" || a[0].Detail != tc.reason {
				t.Errorf("%s audit %+v", tc.wantAction, a)
			}
			if tc.wantState != "" {
				if got := e.storedNode(t, n.id).State; got != tc.wantState {
					t.Errorf("node state %s, want %s", got, tc.wantState)
				}
			} else if _, err := e.db.GetNode(t.Context(), n.id); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("GetNode after deletion = %v, want ErrNotFound", err)
			}
			if len(e.logs.find("session ended by revocation", "reason", tc.reason)) != 1 {
				t.Error("the session's end is not logged with the reason")
			}
		})
	}
}

// TestReclaimEndsTheOldSession reclaims a node whose old identity holds a
// live session: the session gets a revocation notice and ends, as for a
// revocation.
func TestReclaimEndsTheOldSession(t *testing.T) { overBothTransports(t, testReclaimEndsTheOldSession) }

func testReclaimEndsTheOldSession(t *testing.T, grpcSessions bool) {
	e := newEnv(t)
	e.grpcSessions = grpcSessions
	first := newMachine(t, "web")
	s1, _ := e.token(t, nil)
	old := e.mustJoin(t, first, e.request(t, first, s1))
	_, gw := e.nodeClients(t, old)
	stream, _ := openSession(t, gw, "proc-a")

	m := newMachine(t, "web")
	m.claims = first.claims
	secret, _ := e.token(t, &adminv1.CreateTokenRequest{Role: "worker", AllowReclaim: true})
	if _, err := e.join.Join(t.Context(), e.request(t, m, secret)); err != nil {
		t.Fatalf("reclaim: %v", err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatalf("Recv: %v, want a revocation notice", err)
	}
	if r := msg.GetRevoked(); r == nil || r.Reason != "reclaimed" || r.IdentityGeneration != 2 {
		t.Fatalf("message %v, want a revocation notice for the reclaim at generation 2", msg)
	}
	_, err = stream.Recv()
	wantStatus(t, err, codes.Unauthenticated, "certificate revoked: reclaimed")
	if len(e.logs.find("session of the reclaimed identity ended", "node_id", old.id)) != 1 {
		t.Error("the end of the old session is not logged")
	}
}

func TestRevocationWithoutASession(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(t, "web")
	resp, err := e.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: n.id, Reason: "retired"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.SessionNotified {
		t.Error("RevokeNode says a session was notified, and the node has none")
	}
}

// ackProbes answers the server's probes on s until it ends, and returns
// the revocation it received, if any, and the stream's end.
func ackProbes(s gatewayv1.Gateway_SessionClient) (revoked chan *gatewayv1.RevocationNotice, end chan error) {
	revoked, end = make(chan *gatewayv1.RevocationNotice, 1), make(chan error, 1)
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				end <- err
				return
			}
			switch b := m.Body.(type) {
			case *gatewayv1.SessionResponse_Probe:
				_ = s.Send(&gatewayv1.SessionRequest{Id: m.Id, Body: &gatewayv1.SessionRequest_ProbeAck{ProbeAck: &gatewayv1.Pong{}}})
			case *gatewayv1.SessionResponse_Revoked:
				revoked <- b.Revoked
			}
		}
	}()
	return revoked, end
}

func TestSecondSession(t *testing.T) { overBothTransports(t, testSecondSession) }

func testSecondSession(t *testing.T, grpcSessions bool) {
	t.Run("a reconnect of the same process replaces its session", func(t *testing.T) {
		e := newEnv(t)
		e.grpcSessions = grpcSessions
		n := e.newNode(t, "web")
		_, gw := e.nodeClients(t, n)
		first, _ := openSession(t, gw, "proc-a")
		openSession(t, gw, "proc-a")
		_, err := first.Recv()
		wantStatus(t, err, codes.Aborted, "replaced by a newer session of this node")
		if got := e.storedNode(t, n.id).State; got != store.StateActive {
			t.Errorf("node state %s, want active", got)
		}
	})

	t.Run("another process while the first still answers means a cloned certificate", func(t *testing.T) {
		e := newEnv(t)
		e.grpcSessions = grpcSessions
		n := e.newNode(t, "web")
		_, gw := e.nodeClients(t, n)
		first, _ := openSession(t, gw, "proc-a")
		firstRevoked, firstEnd := ackProbes(first)

		second, err := gw.Session(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := second.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "proc-b"}}}); err != nil {
			t.Fatal(err)
		}
		const reason = "certificate looks cloned: two live sessions at once (instances proc-a and proc-b)"
		m, err := second.Recv()
		if err != nil || m.GetRevoked().GetReason() != reason || m.GetRevoked().GetIdentityGeneration() != 2 {
			t.Fatalf("second session got %v, %v; want a revocation notice for generation 2", m, err)
		}
		_, err = second.Recv()
		wantStatus(t, err, codes.Unauthenticated, "certificate revoked: "+reason)

		if r := <-firstRevoked; r.Reason != reason {
			t.Errorf("first session's notice %q", r.Reason)
		}
		wantStatus(t, <-firstEnd, codes.Unauthenticated, "certificate revoked: "+reason)
		if got := e.storedNode(t, n.id); got.State != store.StateRevoked || got.Generation != 2 {
			t.Errorf("node %+v, want revoked at generation 2", got)
		}
		if a := e.audit(t, "node.revoke"); len(a) != 1 || a[0].Actor != "fleetd" || a[0].Detail != reason {
			t.Errorf("revocation audit %+v, want one by fleetd", a)
		}
	})

	t.Run("another process after the first stopped answering replaces it", func(t *testing.T) {
		e := newEnv(t, func(c *service.Config) { c.ProbeTimeout = 100 * time.Millisecond })
		e.grpcSessions = grpcSessions
		n := e.newNode(t, "web")
		_, gw := e.nodeClients(t, n)
		first, _ := openSession(t, gw, "proc-a")
		// The first process reads nothing, so it never acknowledges the
		// probe; the second is welcomed once the probe times out.
		openSession(t, gw, "proc-b")
		m, err := first.Recv()
		if err != nil || m.GetProbe() == nil {
			t.Fatalf("first session got %v, %v; want the probe", m, err)
		}
		_, err = first.Recv()
		wantStatus(t, err, codes.Aborted, "replaced by a newer session of this node")
		if got := e.storedNode(t, n.id).State; got != store.StateActive {
			t.Errorf("node state %s, want active", got)
		}
		if len(e.logs.find("session replaced one that no longer answers", "node_id", n.id)) != 1 {
			t.Error("the replacement is not logged")
		}
	})
}

func TestSessionEndsWhenTheServerStops(t *testing.T) {
	overBothTransports(t, testSessionEndsWhenTheServerStops)
}

func testSessionEndsWhenTheServerStops(t *testing.T, grpcSessions bool) {
	e := newEnv(t)
	e.grpcSessions = grpcSessions
	n := e.newNode(t, "web")
	_, gw := e.nodeClients(t, n)
	stream, _ := openSession(t, gw, "proc-a")
	e.stop()
	_, err := stream.Recv()
	wantStatus(t, err, codes.Unavailable, "fleetd is shutting down; reconnect")
}

// TestUnaryAndSessionRenewalsShareTheLimit: a node renews with the unary
// call or on its session, and both count against the same limit.
func TestUnaryAndSessionRenewalsShareTheLimit(t *testing.T) {
	e := newEnv(t, func(c *service.Config) { c.RenewalLimit = 1 })
	n := e.newNode(t, "web")
	client, gw := e.nodeClients(t, n)
	r := e.renewal(t, n)
	if _, err := client.Renew(t.Context(), r.req); err != nil {
		t.Fatal(err)
	}
	stream, _ := openSession(t, gw, "proc-a")
	m := call(t, stream, &gatewayv1.SessionRequest{Id: 2, Body: &gatewayv1.SessionRequest_Renew{Renew: e.renewal(t, n).req}})
	if er := m.GetError(); er == nil || codes.Code(er.Code) != codes.ResourceExhausted {
		t.Fatalf("session renewal after a unary one: %v, want RESOURCE_EXHAUSTED", m)
	}
}
