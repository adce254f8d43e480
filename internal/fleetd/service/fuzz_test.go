package service

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
)

// The fuzz targets below feed every request the control plane accepts,
// as protobuf bytes from the network, to its handler on a real PKI and
// SQLite store: no input may panic, and every answer is one the wire
// mapping knows (a join's refusal is always "Join refused").

func mustMarshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// checkAnswer fails when err would reach a caller as anything but a
// refusal or a retryable failure.
func checkAnswer(t *testing.T, s *Server, err error, join bool) {
	t.Helper()
	if err == nil {
		return
	}
	st, _ := status.FromError(s.wireError(context.Background(), err))
	switch {
	case join && st.Code() == codes.PermissionDenied && st.Message() != JoinRefused:
		t.Fatalf("a join refused with %q, want %q", st.Message(), JoinRefused)
	case st.Code() == codes.Unknown || st.Code() == codes.Internal:
		t.Fatalf("answered %v: a handler error escaped the mapping", st)
	}
}

func FuzzJoinRequest(f *testing.F) {
	s := testServer(f, Config{})
	secret, _ := storeToken(f, s)
	f.Add(mustMarshal(f, tokenJoin(f, s, secret, "web-01").req))
	f.Add(mustMarshal(f, &joinv1.JoinRequest{Attestor: "tpm", Csr: tokenJoin(f, s, secret, "x").req.Csr, Tpm: &joinv1.TpmEvidence{EkPublic: []byte{0, 1}}}))
	f.Add(mustMarshal(f, &joinv1.JoinRequest{Attestor: "token", DeferralId: "abc", NodeId: "Bad Id"}))
	f.Add([]byte{0x0a, 0xff, 0xff, 0x03})
	j := &joinService{s: s}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req joinv1.JoinRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		_, err := j.Join(fromPeer("192.0.2.1"), &req)
		checkAnswer(t, s, err, true)
	})
}

// FuzzIntakeRequest feeds intake requests, first rounds and answers to
// rounds, to the handler: a refusal is always "Intake refused: …" and
// never names its reason.
func FuzzIntakeRequest(f *testing.F) {
	s := testServer(f, Config{})
	secret, _ := storeToken(f, s)
	csr := tokenJoin(f, s, secret, "x").req.Csr
	f.Add(mustMarshal(f, &joinv1.IntakeRequest{Csr: csr, Tpm: &joinv1.TpmEvidence{EkPublic: []byte{0, 1}}}))
	f.Add(mustMarshal(f, &joinv1.IntakeRequest{Csr: csr, DeferralId: "abc", Answer: &joinv1.ChallengeAnswer{Round: 1}}))
	f.Add(mustMarshal(f, &joinv1.IntakeRequest{Csr: csr, Claims: &joinv1.HardwareClaims{ProductUuid: "x"}}))
	f.Add([]byte{0x0a, 0xff, 0xff, 0x03})
	j := &joinService{s: s}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req joinv1.IntakeRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		_, err := j.Intake(fromPeer("192.0.2.1"), &req)
		checkAnswer(t, s, err, false)
		if st, _ := status.FromError(s.wireError(context.Background(), err)); err != nil && st.Code() == codes.PermissionDenied &&
			!strings.HasPrefix(st.Message(), IntakeRefused+": ") {
			t.Fatalf("an intake refused with %q, want %q and what to do", st.Message(), IntakeRefused)
		}
	})
}

func FuzzRenewRequest(f *testing.F) {
	s := testServer(f, Config{})
	n := joinNodes(f, s, 1)[0]
	f.Add(mustMarshal(f, &joinv1.RenewRequest{Chain: n.chain, Csr: []byte{1}, ClientTimeUnixNano: 1}))
	f.Add(mustMarshal(f, &joinv1.RenewRequest{Chain: [][]byte{{0x30, 0x03}}, KeyAttestation: &joinv1.KeyAttestation{AkPublic: []byte{1}}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req joinv1.RenewRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		caller := *n.caller // each call as a fresh session's caller
		_, err := s.renew(context.Background(), &caller, &req, nil)
		checkAnswer(t, s, err, false)
	})
}

func FuzzSessionRequest(f *testing.F) {
	s := testServer(f, Config{})
	n := joinNodes(f, s, 1)[0]
	f.Add(mustMarshal(f, &gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Ping{Ping: &gatewayv1.Ping{}}}))
	f.Add(mustMarshal(f, &gatewayv1.SessionRequest{Id: 2, Body: &gatewayv1.SessionRequest_Renew{Renew: &joinv1.RenewRequest{Chain: n.chain}}}))
	f.Add(mustMarshal(f, &gatewayv1.SessionRequest{Id: 3, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "x"}}}))
	f.Add(mustMarshal(f, &gatewayv1.SessionRequest{Id: 4, Body: &gatewayv1.SessionRequest_NonceRequest{NonceRequest: &gatewayv1.NonceRequest{Purpose: gatewayv1.NoncePurpose_NONCE_PURPOSE_RENEWAL}}}))
	f.Add(mustMarshal(f, &gatewayv1.SessionRequest{Id: 5, Body: &gatewayv1.SessionRequest_BootEvidence{BootEvidence: &gatewayv1.BootEvidence{Nonce: []byte("n"), Pcrs: map[uint32][]byte{0: make([]byte, 32)}}}}))
	f.Add(mustMarshal(f, &gatewayv1.SessionRequest{Id: 6, Body: &gatewayv1.SessionRequest_AttestedRenew{AttestedRenew: &gatewayv1.AttestedRenew{Renew: &joinv1.RenewRequest{Chain: n.chain}}}}))
	g := &gateway{s: s}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m gatewayv1.SessionRequest
		if proto.Unmarshal(data, &m) != nil {
			return
		}
		caller := *n.caller
		resp := g.handle(context.Background(), &caller, &nonceBook{}, &m)
		if resp.Id != m.Id || resp.Body == nil {
			t.Fatalf("answer %v to request %d: want its id and a body", resp, m.Id)
		}
		if e := resp.GetError(); e != nil && (codes.Code(e.Code) == codes.Unknown || codes.Code(e.Code) == codes.Internal) {
			t.Fatalf("session answered %v: a handler error escaped the mapping", e)
		}
	})
}

// FuzzAdminRequest sends one admin call, chosen by the first byte, with
// the rest as its request, from an authenticated admin: admin input is
// trusted more, but must still not crash the control plane.
func FuzzAdminRequest(f *testing.F) {
	s := testServer(f, Config{})
	a := &adminService{s: s}
	ctx := context.WithValue(context.Background(), adminKey{}, "fuzz")
	calls := []func([]byte) error{
		func(b []byte) error { return call(b, &adminv1.CreateTokenRequest{}, a.CreateToken, ctx) },
		func(b []byte) error { return call(b, &adminv1.ListTokensRequest{}, a.ListTokens, ctx) },
		func(b []byte) error { return call(b, &adminv1.ListNodesRequest{}, a.ListNodes, ctx) },
		func(b []byte) error { return call(b, &adminv1.GetNodeRequest{}, a.GetNode, ctx) },
		func(b []byte) error { return call(b, &adminv1.RevokeNodeRequest{}, a.RevokeNode, ctx) },
		func(b []byte) error { return call(b, &adminv1.DeleteNodeRequest{}, a.DeleteNode, ctx) },
		func(b []byte) error { return call(b, &adminv1.ApproveNodeRequest{}, a.ApproveNode, ctx) },
		func(b []byte) error { return call(b, &adminv1.ListPendingRequest{}, a.ListPending, ctx) },
	}
	f.Add(append([]byte{0}, mustMarshal(f, &adminv1.CreateTokenRequest{Role: "worker", TtlSeconds: -1})...))
	f.Add(append([]byte{4}, mustMarshal(f, &adminv1.RevokeNodeRequest{Id: "web-01", Reason: "line\nbreak"})...))
	f.Add(append([]byte{5}, mustMarshal(f, &adminv1.DeleteNodeRequest{Id: "nope"})...))
	f.Add([]byte{6})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		err := calls[int(data[0])%len(calls)](data[1:])
		checkAnswer(t, s, err, false)
	})
}

// call decodes b into req and calls h with it; undecodable bytes are no
// call at all (gRPC would refuse them).
func call[Req proto.Message, Resp any](b []byte, req Req, h func(context.Context, Req) (Resp, error), ctx context.Context) error {
	if proto.Unmarshal(b, req) != nil {
		return nil
	}
	_, err := h(ctx, req)
	return err
}
