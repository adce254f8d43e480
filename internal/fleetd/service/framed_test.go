package service_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// framedGateway is a GatewayClient whose Session is a framed session
// (api/sessionframe) on its own mutual-TLS connection, as bcd opens it:
// the session tests run unchanged over it.
type framedGateway struct {
	e    *env
	cert *tls.Certificate
}

func (e *env) framedGateway(cert *tls.Certificate) gatewayv1.GatewayClient {
	return &framedGateway{e: e, cert: cert}
}

func (g *framedGateway) Session(ctx context.Context, _ ...grpc.CallOption) (gatewayv1.Gateway_SessionClient, error) {
	get := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return g.cert, nil }
	tc := tlspin.Client(g.e.bundle.ServingCASPKIPin, g.e.bundle.ServerName, get)
	c, err := sessionframe.Dial(ctx, g.e.addr, tc, 0)
	if err != nil {
		return nil, err
	}
	g.e.t.Cleanup(func() { c.Close() })
	stop := context.AfterFunc(ctx, func() { c.Close() })
	return &framedStream{c: c, ctx: ctx, stop: stop}, nil
}

// framedStream adapts a sessionframe.Client to gRPC's stream interface.
type framedStream struct {
	c    *sessionframe.Client
	ctx  context.Context
	stop func() bool
}

func (s *framedStream) Send(m *gatewayv1.SessionRequest) error    { return s.c.Send(m) }
func (s *framedStream) Recv() (*gatewayv1.SessionResponse, error) { return s.c.Recv() }
func (s *framedStream) Header() (metadata.MD, error)              { return nil, nil }
func (s *framedStream) Trailer() metadata.MD                      { return nil }
func (s *framedStream) CloseSend() error                          { s.stop(); return s.c.Close() }
func (s *framedStream) Context() context.Context                  { return s.ctx }
func (s *framedStream) SendMsg(any) error                         { return errors.New("not used") }
func (s *framedStream) RecvMsg(any) error                         { return errors.New("not used") }

// endPushback is the pushback, in milliseconds ("" for none), of a
// session that ended with err: the gRPC Session's grpc-retry-pushback-ms
// trailer, or the framed session's SessionEnd.retry_pushback_ms.
func endPushback(t *testing.T, stream gatewayv1.Gateway_SessionClient, err error) string {
	t.Helper()
	if _, framed := stream.(*framedStream); !framed {
		if v := stream.Trailer().Get("grpc-retry-pushback-ms"); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	var end *sessionframe.EndError
	if !errors.As(err, &end) {
		t.Fatalf("the framed session ended with %v, want its SessionEnd", err)
	}
	if end.RetryPushback == 0 {
		return ""
	}
	return strconv.FormatInt(end.RetryPushback.Milliseconds(), 10)
}

// overBothTransports runs a session test over the framed session and over
// the gRPC Session.
func overBothTransports(t *testing.T, test func(t *testing.T, grpcSessions bool)) {
	t.Run("framed", func(t *testing.T) { test(t, false) })
	t.Run("grpc", func(t *testing.T) { test(t, true) })
}
