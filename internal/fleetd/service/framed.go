package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
	"github.com/nodetrust/nodetrust/internal/fleetd/connlimit"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// framedWriteTimeout bounds one write to a framed session: a node that
// stops reading cannot hold a revocation, a probe or a check longer.
const framedWriteTimeout = 10 * time.Second

// framedCredentials wraps the gRPC server's TLS credentials: a connection
// whose handshake chose the framed session's protocol (ALPN
// nodetrust-session/1) is served here, on gRPC's own connection goroutine,
// and gRPC is told it was dispatched; every other connection goes on to
// gRPC as before. One listener, one TLS configuration, one set of
// connection limits for both.
func (s *Server) framedCredentials(inner credentials.TransportCredentials) credentials.TransportCredentials {
	return &framedCreds{TransportCredentials: inner, s: s}
}

type framedCreds struct {
	credentials.TransportCredentials
	s *Server
}

func (c *framedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, info, err
	}
	ti, ok := info.(credentials.TLSInfo)
	if !ok || ti.State.NegotiatedProtocol != sessionframe.ALPN {
		return conn, info, nil
	}
	c.s.serveFramed(raw, conn, ti)
	return nil, nil, credentials.ErrConnDispatched
}

func (c *framedCreds) Clone() credentials.TransportCredentials {
	return &framedCreds{TransportCredentials: c.TransportCredentials.Clone(), s: c.s}
}

// serveFramed runs one framed session on conn, the TLS connection over
// raw, until it ends; it closes conn.
func (s *Server) serveFramed(raw, conn net.Conn, ti credentials.TLSInfo) {
	fs := sessionframe.NewServer(conn, framedWriteTimeout)
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: raw.RemoteAddr(), LocalAddr: raw.LocalAddr(), AuthInfo: ti})
	end := func(err error) { fs.End(s.wireError(ctx, err)) }
	lc, _ := raw.(*connlimit.Conn)
	if lc != nil {
		// Past its handshake; and like a connection carrying a stream,
		// never displaced for a newcomer.
		lc.Established()
		lc.HoldStream()
		defer lc.ReleaseStream()
		if tc, ok := lc.NetConn().(*net.TCPConn); ok {
			_ = tc.SetKeepAliveConfig(sessionframe.Keepalive)
		}
	}
	// gRPC's handshake deadline still runs: the Hello must come within
	// it too. Then no deadline: a session is held for as long as the
	// node lives, and TCP keepalive finds a node that vanished.
	caller, err := s.nodeFromPeer(ctx)
	if err != nil {
		end(err)
		return
	}
	first, err := s.recvFramed(ctx, fs)
	if err != nil {
		end(err)
		return
	}
	_ = raw.SetDeadline(time.Time{})
	sess, err := s.gateway.open(ctx, caller, first, fs.Send, func(sess *session) {
		// stop must not block: the last frame is written on its own.
		go func() {
			final, err := sess.ending()
			if final != nil {
				_ = fs.Send(final)
			}
			end(err)
		}()
	})
	if err != nil {
		end(err)
		return
	}
	defer s.gateway.close(sess)
	for {
		m, err := s.recvFramed(ctx, fs)
		if err == nil {
			err = s.gateway.onRequest(sess, m)
		}
		if err != nil {
			select {
			case <-sess.stopped:
				// stop's goroutine writes the last frame and closes.
			default:
				s.log.DebugContext(ctx, "session closed", logkey.NodeID, sess.nodeID, logkey.Error, err)
				var ce *callError
				if errors.As(err, &ce) {
					end(err)
				} else {
					_ = conn.Close()
				}
			}
			return
		}
	}
}

// recvFramed reads one request of a framed session, bounded as gRPC's
// Session is (counted and refused when over its size).
func (s *Server) recvFramed(ctx context.Context, fs *sessionframe.Server) (*gatewayv1.SessionRequest, error) {
	m, err := fs.Recv()
	if errors.Is(err, sessionframe.ErrFrameTooLarge) {
		return nil, s.oversized(ctx, gatewayv1.Gateway_Session_FullMethodName, fmt.Sprintf("more than %d bytes", sessionframe.MaxFrame), methodLimit(gatewayv1.Gateway_Session_FullMethodName))
	}
	if err != nil {
		return nil, err
	}
	if err := s.checkSize(ctx, gatewayv1.Gateway_Session_FullMethodName, m); err != nil {
		return nil, err
	}
	return m, nil
}
