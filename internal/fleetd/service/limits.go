package service

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/connlimit"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// Limits bound what hostile traffic can cost the server: connections,
// message sizes, refusal log lines and refusal audit records
// (docs/security.md). New fills in the defaults of zero fields.
type Limits struct {
	// MaxConns, MaxConnsPerSource and MaxHandshakes bound the gRPC
	// listener's connections (package connlimit); the HTTPS listener gets
	// at most HTTPMaxConns of them.
	MaxConns          int
	MaxConnsPerSource int
	MaxHandshakes     int
	HTTPMaxConns      int
	// HandshakeTimeout bounds a connection's TLS handshake and HTTP/2
	// preface; IdleTimeout closes a connection that carries no stream.
	HandshakeTimeout time.Duration
	IdleTimeout      time.Duration
	// KeepaliveTime is how long a quiet connection waits before the
	// server pings it; KeepaliveTimeout how long the ping may go
	// unanswered before the connection is closed.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// RefusalLogBurst refusal lines per reason and source are logged in
	// each RefusalLogWindow; the rest are counted, and one summary line
	// per window says how many were dropped.
	RefusalLogBurst  int
	RefusalLogWindow time.Duration
	// RefusalAuditWindow: at most one audit record per token and refusal
	// reason in each window.
	RefusalAuditWindow time.Duration
}

// DefaultLimits are the limits of a server whose configuration sets none.
var DefaultLimits = Limits{
	MaxConns:           16384,
	MaxConnsPerSource:  256,
	MaxHandshakes:      1024,
	HTTPMaxConns:       1024,
	HandshakeTimeout:   10 * time.Second,
	IdleTimeout:        time.Minute,
	KeepaliveTime:      time.Minute,
	KeepaliveTimeout:   20 * time.Second,
	RefusalLogBurst:    5,
	RefusalLogWindow:   time.Minute,
	RefusalAuditWindow: 10 * time.Minute,
}

func (l *Limits) applyDefaults() {
	d := DefaultLimits
	for _, f := range []struct{ v, def *int }{
		{&l.MaxConns, &d.MaxConns}, {&l.MaxConnsPerSource, &d.MaxConnsPerSource},
		{&l.MaxHandshakes, &d.MaxHandshakes}, {&l.HTTPMaxConns, &d.HTTPMaxConns}, {&l.RefusalLogBurst, &d.RefusalLogBurst},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	for _, f := range []struct{ v, def *time.Duration }{
		{&l.HandshakeTimeout, &d.HandshakeTimeout}, {&l.IdleTimeout, &d.IdleTimeout},
		{&l.KeepaliveTime, &d.KeepaliveTime}, {&l.KeepaliveTimeout, &d.KeepaliveTimeout},
		{&l.RefusalLogWindow, &d.RefusalLogWindow}, {&l.RefusalAuditWindow, &d.RefusalAuditWindow},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	l.HTTPMaxConns = min(l.HTTPMaxConns, l.MaxConns)
}

// Message size limits, per method: the bytes of one encoded request. A
// join carries at most a CSR, a sealed token and capped claims; a tpm join
// also its TPM evidence, whose event log is the one large part (tens of
// KiB on real machines).
const (
	// maxJoinBytes is the largest message any method takes: a tpm join.
	// gRPC itself refuses larger ones before they are read, with
	// RESOURCE_EXHAUSTED (counted and logged by sizeStats).
	maxJoinBytes = 512 << 10
	// maxTokenJoinBytes bounds a join that carries no TPM evidence; a
	// larger one is refused as any join is, "Join refused".
	maxTokenJoinBytes = 64 << 10
	// maxStreamsPerConn bounds the calls in flight on one connection, and
	// so the request bytes it can make the server hold.
	maxStreamsPerConn = 32
	// maxCallBytes bounds every other request and session message.
	maxCallBytes = 64 << 10
	// maxWellKnownBytes bounds GetWellKnown, which takes nothing.
	maxWellKnownBytes = 1 << 10
)

// methodLimit is the size limit of one request of method.
func methodLimit(method string) int {
	switch method {
	case joinv1.JoinService_Join_FullMethodName, joinv1.JoinService_Intake_FullMethodName:
		return maxJoinBytes
	case joinv1.JoinService_GetWellKnown_FullMethodName:
		return maxWellKnownBytes
	}
	return maxCallBytes
}

// refusalCode classifies why a join was refused. The set is fixed: it
// labels a metric and keys the refusal log and audit throttles. It is a
// struct, not a string, so that a format string can never be passed where
// a code belongs.
type refusalCode struct{ name string }

// String is the code's metric label.
func (c refusalCode) String() string { return c.name }

var (
	reasonCSR          = refusalCode{"csr_invalid"}
	reasonAttestor     = refusalCode{"attestor_invalid"}
	reasonOversized    = refusalCode{"oversized"}
	reasonTokenSeal    = refusalCode{"token_unsealed"}
	reasonTokenUnknown = refusalCode{"token_unknown"}
	reasonTokenUsed    = refusalCode{"token_used"}
	reasonTokenExpired = refusalCode{"token_expired"}
	reasonTokenScope   = refusalCode{"token_scope"}
	reasonDeferral     = refusalCode{"deferral_invalid"}
	reasonNodeConflict = refusalCode{"node_conflict"}
	reasonTPMEvidence  = refusalCode{"tpm_evidence"}
	reasonTPMChallenge = refusalCode{"tpm_challenge"}
	// reasonBootPolicy is a proven boot its class's policy does not
	// accept, or could not judge.
	reasonBootPolicy = refusalCode{"boot_policy"}
	// reasonNotAdmitted is a refusal of the lifecycle's admission: an
	// undeclared machine, an unhonoured binding, a state that may not join.
	reasonNotAdmitted = refusalCode{"not_admitted"}
	// reasonLAK is a LAK certificate that does not prove the join's AK,
	// or an installed node's join with another AK than its LAK.
	reasonLAK = refusalCode{"lak"}
)

// checkJoinSize refuses a join without TPM evidence that is larger than
// such a join can be.
func checkJoinSize(req *joinv1.JoinRequest) error {
	if req.Attestor == "tpm" {
		return nil
	}
	if n := proto.Size(req); n > maxTokenJoinBytes {
		return refuse(reasonOversized, "a join without TPM evidence of %d bytes is over the %d-byte limit", n, maxTokenJoinBytes)
	}
	return nil
}

// peerSource is the caller's source address as the throttles key it (an
// IPv6 caller by its /64).
func peerSource(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	return connlimit.SourceOf(p.Addr).String()
}

// refusedJoin counts, logs and audits a refused join, each within its
// bound: the metric counts every refusal; the log line and the audit
// record pass their throttles (per reason and source, per reason and
// token) or are counted as dropped.
func (s *Server) refusedJoin(ctx context.Context, req *joinv1.JoinRequest, r *refusal, reqID string) {
	s.metrics.join(req.GetAttestor(), "refused")
	s.metrics.joinRefusals.WithLabelValues(r.code.String()).Inc()
	if ok, _ := s.logThrottle.Allow(r.code.String(), peerSource(ctx)); ok {
		s.log.WarnContext(ctx, "join refused", logkey.RequestID, reqID, logkey.Reason, r.reason, "reason_code", r.code.String(),
			logkey.TokenID, r.tokenID, logkey.ClaimedHostname, capClaim(req.GetClaims().GetHostname()),
			logkey.Peer, peerAddr(ctx))
	}
	if !r.audit {
		return
	}
	ok, held := s.auditThrottle.Allow(r.code.String(), r.tokenID)
	if !ok {
		s.metrics.auditDropped.Inc()
		return
	}
	detail := r.reason + " (request " + reqID + ")"
	if held > 0 {
		detail += fmt.Sprintf("; %d more refusals of this token for this reason since the last record", held)
	}
	_ = s.cfg.Store.AppendAudit(ctx, store.AuditEvent{
		Time: s.cfg.Now(), Actor: "join", Action: "join.refused",
		Subject: "token:" + r.tokenID, Detail: detail,
	})
}

// logRefusal logs a refusal that is not a join's (a connection over a
// limit, an oversized call) through the log throttle.
func (s *Server) logRefusal(ctx context.Context, code, source, msg string, attrs ...any) {
	if ok, _ := s.logThrottle.Allow(code, source); ok {
		s.log.WarnContext(ctx, msg, attrs...)
	}
}

// summarizeDropped logs one line with the refusal log lines the throttle
// dropped since the last call, if any.
func (s *Server) summarizeDropped(ctx context.Context) {
	dropped := s.logThrottle.TakeDropped()
	if len(dropped) == 0 {
		return
	}
	var total uint64
	var sources int
	parts := make([]string, 0, len(dropped))
	for _, d := range dropped {
		total += d.Events
		sources += d.Keys
		parts = append(parts, fmt.Sprintf("%s=%d", d.Group, d.Events))
	}
	s.metrics.logDropped.Add(float64(total))
	s.log.WarnContext(ctx, "refusal log lines dropped", "dropped", total, "sources", sources,
		"by_reason", strings.Join(parts, ","), "window", s.cfg.Limits.RefusalLogWindow.String())
}

// summarizeEvery logs the dropped-lines summary each window until ctx is
// done, and once more then.
func (s *Server) summarizeEvery(ctx context.Context) {
	t := time.NewTicker(s.cfg.Limits.RefusalLogWindow)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.summarizeDropped(ctx)
		case <-ctx.Done():
			s.summarizeDropped(context.WithoutCancel(ctx))
			return
		}
	}
}

// LimitListener bounds the connections of ln (named listener in metrics
// and logs) by s's limits: the gRPC listener's, or the HTTPS listener's.
func (s *Server) LimitListener(ln net.Listener, listener string) (*connlimit.Listener, error) {
	lim := s.cfg.Limits
	cfg := connlimit.Config{MaxConns: lim.MaxConns, MaxPerSource: lim.MaxConnsPerSource, MaxHandshakes: lim.MaxHandshakes}
	if listener != "grpc" {
		cfg.MaxConns = lim.HTTPMaxConns
		cfg.MaxPerSource = min(cfg.MaxPerSource, cfg.MaxConns)
		cfg.MaxHandshakes = min(cfg.MaxHandshakes, cfg.MaxConns)
	}
	cfg.OnEvent = func(e connlimit.Event) {
		src := e.Source.String()
		if e.Displaced {
			s.metrics.connDisplaced.WithLabelValues(listener, string(e.Limit)).Inc()
			s.logRefusal(context.Background(), "conn_displaced_"+string(e.Limit), src, "idle connection closed for another source's",
				"listener", listener, "limit", string(e.Limit), "source", src)
			return
		}
		s.metrics.connRefused.WithLabelValues(listener, string(e.Limit)).Inc()
		s.logRefusal(context.Background(), "conn_refused_"+string(e.Limit), src, "connection refused over a limit",
			"listener", listener, "limit", string(e.Limit), "source", src)
	}
	l, err := connlimit.New(ln, cfg)
	if err != nil {
		return nil, err
	}
	s.metrics.watchListener(listener, l)
	return l, nil
}

// knownMethod is method if the server serves it, else "other": a metric
// label a caller cannot grow.
func (s *Server) knownMethod(method string) string {
	if _, ok := s.methods[method]; ok {
		return method
	}
	return "other"
}

// checkSize refuses a decoded request larger than its method's limit.
func (s *Server) checkSize(ctx context.Context, method string, msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil
	}
	if n, limit := proto.Size(m), methodLimit(method); n > limit {
		return s.oversized(ctx, method, fmt.Sprintf("%d bytes", n), limit)
	}
	return nil
}

// oversized counts and logs a request over its method's limit and
// returns the error its caller gets.
func (s *Server) oversized(ctx context.Context, method, size string, limit int) error {
	method = s.knownMethod(method)
	s.metrics.oversized.WithLabelValues(method).Inc()
	s.logRefusal(ctx, "oversized", peerSource(ctx), "request over its size limit",
		"method", method, "size", size, "limit", limit, logkey.Peer, peerAddr(ctx))
	return refused(codes.ResourceExhausted, "a request of %s is over the %d-byte limit of %s", size, limit, method)
}

// limitUnary refuses unary requests over their method's limit.
func (s *Server) limitUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.checkSize(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// limitStream checks every message a stream receives against its
// method's limit.
func (s *Server) limitStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &sizedStream{ServerStream: ss, s: s, method: info.FullMethod})
}

type sizedStream struct {
	grpc.ServerStream
	s      *Server
	method string
}

func (st *sizedStream) RecvMsg(m any) error {
	err := st.ServerStream.RecvMsg(m)
	ctx := st.Context()
	if status.Code(err) == codes.ResourceExhausted {
		// gRPC refused it unread: larger than any method takes.
		return st.s.oversized(ctx, st.method, fmt.Sprintf("more than %d bytes", maxJoinBytes), methodLimit(st.method))
	}
	if err != nil {
		return err
	}
	return st.s.checkSize(ctx, st.method, m)
}

// sizeStats counts and logs the requests gRPC refuses before any handler
// sees them: those larger than maxJoinBytes. gRPC answers them
// RESOURCE_EXHAUSTED itself, a join included.
type sizeStats struct{ s *Server }

type rpcKey struct{}

// rpcInfo is what sizeStats knows of one call.
type rpcInfo struct {
	method   string
	received atomic.Bool
}

func (h sizeStats) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, rpcKey{}, &rpcInfo{method: h.s.knownMethod(info.FullMethodName)})
}

func (h sizeStats) HandleRPC(ctx context.Context, st stats.RPCStats) {
	ri, _ := ctx.Value(rpcKey{}).(*rpcInfo)
	if ri == nil {
		return
	}
	switch e := st.(type) {
	case *stats.InPayload:
		ri.received.Store(true)
	case *stats.End:
		// A stream's handler sees its own oversized messages (sizedStream).
		if ri.received.Load() || ri.method == gatewayv1.Gateway_Session_FullMethodName {
			return
		}
		if status.Code(e.Error) == codes.ResourceExhausted && strings.Contains(status.Convert(e.Error).Message(), "larger than max") {
			h.s.metrics.oversized.WithLabelValues(ri.method).Inc()
			if ri.method == joinv1.JoinService_Join_FullMethodName {
				h.s.metrics.join("other", "refused")
				h.s.metrics.joinRefusals.WithLabelValues(reasonOversized.String()).Inc()
			}
			h.s.logRefusal(ctx, "oversized", peerSource(ctx), "request over its size limit",
				"method", ri.method, "limit", maxJoinBytes, logkey.Peer, peerAddr(ctx))
		}
	}
}

func (sizeStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (sizeStats) HandleConn(context.Context, stats.ConnStats) {}
