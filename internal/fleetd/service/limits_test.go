package service

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// testClock is a settable clock.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// syncBuf is a log destination safe for concurrent writers.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) lines(substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func fromPeer(addr string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(addr), Port: 40000}})
}

func refusalAudits(t *testing.T, s *Server) []string {
	t.Helper()
	evs, err := s.cfg.Store.ListAudit(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.Action == "join.refused" {
			out = append(out, e.Detail)
		}
	}
	return out
}

func TestReplayedSpentTokenIsAuditedOncePerTokenReasonAndWindow(t *testing.T) {
	clock := &testClock{now: time.Now()}
	s := testServer(t, Config{Now: clock.Now, Limits: Limits{RefusalAuditWindow: 10 * time.Minute}})
	j := &joinService{s: s}
	secret, _ := storeToken(t, s)
	if _, err := j.Join(fromPeer("192.0.2.1"), tokenJoin(t, s, secret, "first").req); err != nil {
		t.Fatalf("first join: %v", err)
	}
	// Replays with a fresh CSR each, as an attacker holding the spent
	// token can make.
	const replays = 40
	for i := range replays {
		_, err := j.Join(fromPeer("192.0.2.9"), tokenJoin(t, s, secret, "replay").req)
		if st, _ := status.FromError(s.wireError(context.Background(), err)); st.Code() != codes.PermissionDenied || st.Message() != JoinRefused {
			t.Fatalf("replay %d answered %v, want PERMISSION_DENIED %q", i, err, JoinRefused)
		}
	}
	if got := refusalAudits(t, s); len(got) != 1 {
		t.Fatalf("%d refusal audit records after %d replays, want 1: %q", len(got), replays, got)
	}
	if n := testutil.ToFloat64(s.metrics.joinRefusals.WithLabelValues(reasonTokenUsed.String())); n != replays {
		t.Errorf("token_used refusals counted %v, want %d", n, replays)
	}
	if n := testutil.ToFloat64(s.metrics.auditDropped); n != replays-1 {
		t.Errorf("audits dropped %v, want %d", n, replays-1)
	}

	clock.add(10 * time.Minute)
	if _, err := j.Join(fromPeer("192.0.2.9"), tokenJoin(t, s, secret, "replay").req); err == nil {
		t.Fatal("a replay joined")
	}
	got := refusalAudits(t, s)
	if len(got) != 2 || !strings.Contains(got[0], "39 more refusals of this token for this reason") {
		t.Fatalf("after the window: audit records %q, want a second one counting the 39 not audited", got)
	}
}

func TestRefusalLogsAreThrottledPerReasonAndSourceWithASummary(t *testing.T) {
	var buf syncBuf
	s := testServer(t, Config{Logger: slog.New(slog.NewTextHandler(&buf, nil)), Limits: Limits{RefusalLogBurst: 3}})
	j := &joinService{s: s}
	garbage := &joinv1.JoinRequest{Attestor: "token", Csr: []byte("not a CSR")}
	for range 100 {
		_, _ = j.Join(fromPeer("192.0.2.7"), garbage)
	}
	for range 10 {
		_, _ = j.Join(fromPeer("2001:db8:1:2::1"), garbage)
		_, _ = j.Join(fromPeer("2001:db8:1:2::2"), garbage) // the same /64
	}
	if n := buf.lines(`msg="join refused"`); n != 6 {
		t.Fatalf("%d refusal lines for 120 refusals from two sources, want 3 per source:\n%s", n, buf.String())
	}
	s.summarizeDropped(context.Background())
	if n := buf.lines(`msg="refusal log lines dropped" dropped=114 sources=2 by_reason="csr_invalid=114"`); n != 1 {
		t.Fatalf("no summary of the 114 dropped lines:\n%s", buf.String())
	}
	s.summarizeDropped(context.Background())
	if n := buf.lines("refusal log lines dropped"); n != 1 {
		t.Fatalf("a summary with nothing dropped was logged:\n%s", buf.String())
	}
	if n := testutil.ToFloat64(s.metrics.joinRefusals.WithLabelValues(reasonCSR.String())); n != 120 {
		t.Errorf("csr_invalid refusals counted %v, want 120", n)
	}
}

// serveTest serves s on loopback and returns a client connection to it.
func serveTest(t *testing.T, s *Server) *grpc.ClientConn {
	t.Helper()
	addr := serveOnLoopback(t, s)
	tc := tlspin.Client(s.cfg.Authority.Bundle.ServingCASPKIPin, s.cfg.Authority.ServingCert.Leaf.DNSNames[0], nil)
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestOversizedRequestsAreRefusedAndCounted(t *testing.T) {
	var buf syncBuf
	s := testServer(t, Config{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	conn := serveTest(t, s)
	join := joinv1.NewJoinServiceClient(conn)
	ctx := context.Background()
	big := func(n int) string { return strings.Repeat("x", n) }

	joins := []struct {
		name string
		req  *joinv1.JoinRequest
	}{
		{"a token join over its 64 KiB", &joinv1.JoinRequest{Attestor: "token", Csr: []byte{1}, Claims: &joinv1.HardwareClaims{Hostname: big(100 << 10)}}},
		{"a token join just over its limit", &joinv1.JoinRequest{Attestor: "token", Claims: &joinv1.HardwareClaims{Hostname: big(64 << 10)}}},
	}
	for _, c := range joins {
		t.Run(c.name, func(t *testing.T) {
			_, err := join.Join(ctx, c.req)
			if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied || st.Message() != JoinRefused {
				t.Fatalf("answered %v, want PERMISSION_DENIED %q", err, JoinRefused)
			}
		})
	}
	if n := testutil.ToFloat64(s.metrics.joinRefusals.WithLabelValues(reasonOversized.String())); n != 2 {
		t.Errorf("oversized join refusals counted %v, want 2", n)
	}
	t.Run("a join over what gRPC reads", func(t *testing.T) {
		_, err := join.Join(ctx, &joinv1.JoinRequest{Attestor: "tpm", Claims: &joinv1.HardwareClaims{Hostname: big(4 << 20)}})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("answered %v, want gRPC's RESOURCE_EXHAUSTED", err)
		}
		waitCount(t, "the join gRPC refused for its size", func() float64 {
			return testutil.ToFloat64(s.metrics.joinRefusals.WithLabelValues(reasonOversized.String()))
		}, 3)
	})

	t.Run("a renewal over 64 KiB", func(t *testing.T) {
		_, err := join.Renew(ctx, &joinv1.RenewRequest{Csr: []byte(big(100 << 10))})
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "limit of "+joinv1.JoinService_Renew_FullMethodName) {
			t.Fatalf("answered %v, want RESOURCE_EXHAUSTED naming the method's limit", err)
		}
	})
	t.Run("an admin call over what gRPC reads", func(t *testing.T) {
		_, err := adminv1.NewAdminClient(conn).CreateToken(ctx, &adminv1.CreateTokenRequest{Role: big(1 << 20)})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("answered %v, want RESOURCE_EXHAUSTED", err)
		}
	})
	if n := testutil.ToFloat64(s.metrics.oversized.WithLabelValues(joinv1.JoinService_Renew_FullMethodName)); n != 1 {
		t.Errorf("oversized renewals counted %v, want 1", n)
	}
	waitCount(t, "the admin call gRPC refused for its size", func() float64 {
		return testutil.ToFloat64(s.metrics.oversized.WithLabelValues(adminv1.Admin_CreateToken_FullMethodName))
	}, 1)
	if n := buf.lines("request over its size limit"); n < 2 {
		t.Errorf("%d log lines of oversized requests, want one per method:\n%s", n, buf.String())
	}

	t.Run("an unknown method is one metric label", func(t *testing.T) {
		if got := s.knownMethod("/nodetrust.join.v1.JoinService/Nope"); got != "other" {
			t.Fatalf("knownMethod = %q, want other", got)
		}
		if got := s.knownMethod(joinv1.JoinService_Join_FullMethodName); got != joinv1.JoinService_Join_FullMethodName {
			t.Fatalf("knownMethod(Join) = %q", got)
		}
	})
}

// waitCount waits for count() to reach want: gRPC's stats handler sees a
// call's end a moment after the client has its answer.
func waitCount(t *testing.T, what string, count func() float64, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for count() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: counted %v, want %v", what, count(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestJoinOverGRPCWithLimits(t *testing.T) {
	s := testServer(t, Config{})
	conn := serveTest(t, s)
	secret, _ := storeToken(t, s)
	resp, err := joinv1.NewJoinServiceClient(conn).Join(context.Background(), tokenJoin(t, s, secret, "web-01").req)
	if err != nil || resp.GetSigned() == nil {
		t.Fatalf("join over gRPC: %v", err)
	}
	if _, err := joinv1.NewJoinServiceClient(conn).GetWellKnown(context.Background(), &joinv1.GetWellKnownRequest{}); err != nil {
		t.Fatalf("GetWellKnown: %v", err)
	}
}
