package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
	"github.com/nodetrust/nodetrust/internal/fleetd/connlimit"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// framedWriteTimeout bounds one write to a framed session (a variable for
// the tests): a node that stops reading cannot hold a revocation, a probe
// or a check longer.
var framedWriteTimeout = 10 * time.Second

// framedCredentials wraps the gRPC server's TLS credentials: a connection
// whose handshake chose the framed session's protocol (ALPN
// nodetrust-session/1) is taken from gRPC (told it was dispatched) and
// served by serveFramed; every other connection goes on to gRPC as
// before. One listener, one TLS configuration, one set of
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
	// On a goroutine of its own: gRPC's, which made the handshake, has
	// a deep stack that a held session would keep (16 KiB where the
	// session needs a few); and gRPC's shutdown does not wait for it
	// (Serve does, framedConns.shutdown).
	if !c.s.framed.add(conn) {
		_ = conn.Close()
		return nil, nil, credentials.ErrConnDispatched
	}
	go c.s.serveFramed(raw, conn, ti)
	return nil, nil, credentials.ErrConnDispatched
}

// framedConns are the framed sessions' connections, so that a stopping
// server waits for their sessions to end and closes the stragglers.
type framedConns struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	// ctx is every framed session's base context, cancelled once a
	// stopping server's grace has passed.
	ctx    context.Context
	cancel context.CancelFunc
}

// context returns the framed sessions' base context.
func (f *framedConns) context() context.Context {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx == nil {
		f.ctx, f.cancel = context.WithCancel(context.Background())
	}
	return f.ctx
}

// add records c; false once the server stops.
func (f *framedConns) add(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	if f.conns == nil {
		f.conns = map[net.Conn]struct{}{}
	}
	f.conns[c] = struct{}{}
	f.wg.Add(1)
	return true
}

func (f *framedConns) remove(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	f.wg.Done()
}

// shutdown refuses new framed sessions and waits for those held to end
// (the session registry's closeAll ended them); after grace it closes the
// connections left (one still waiting for its Hello, a node that reads
// nothing) and waits for their goroutines.
func (f *framedConns) shutdown(grace time.Duration) {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	ended := make(chan struct{})
	go func() { f.wg.Wait(); close(ended) }()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-ended:
		return
	case <-t.C:
	}
	f.mu.Lock()
	conns := make([]net.Conn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	if f.cancel != nil {
		f.cancel()
	}
	f.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	<-ended
}

func (c *framedCreds) Clone() credentials.TransportCredentials {
	return &framedCreds{TransportCredentials: c.TransportCredentials.Clone(), s: c.s}
}

// serveFramed opens a framed session on conn, the TLS connection over raw,
// and hands it to holdFramed on a fresh goroutine; when it cannot open
// one, it closes conn.
func (s *Server) serveFramed(raw, conn net.Conn, ti credentials.TLSInfo) {
	held := false
	defer func() {
		if !held {
			s.framed.remove(conn)
		}
	}()
	fs := sessionframe.NewServer(conn, framedWriteTimeout)
	// The session's context ends with its connection, or when a stopping
	// server gives up waiting (framedConns.shutdown): a store call of a
	// session never outlives either.
	base, cancel := context.WithCancel(s.framed.context())
	defer func() {
		if !held {
			cancel()
		}
	}()
	ctx := peer.NewContext(base, &peer.Peer{Addr: raw.RemoteAddr(), LocalAddr: raw.LocalAddr(), AuthInfo: ti})
	// A write that failed (its deadline passed: Go's TLS then refuses
	// every later write) ends the session: one that can no longer be
	// written to must not stay registered and miss its revocation.
	send := func(m *gatewayv1.SessionResponse) error {
		err := fs.Send(m)
		if err != nil {
			_ = conn.Close()
		}
		return err
	}
	end := func(err error) {
		pushback, st := s.framedEnd(ctx, err)
		fs.End(st, pushback)
	}
	lc, _ := raw.(*connlimit.Conn)
	if lc != nil {
		// Past its handshake; and like a connection carrying a stream,
		// never displaced for a newcomer.
		lc.Established()
		lc.HoldStream()
		defer func() {
			if !held {
				lc.ReleaseStream()
			}
		}()
		if tc, ok := lc.NetConn().(*net.TCPConn); ok {
			_ = tc.SetKeepAliveConfig(sessionframe.Keepalive)
		}
	}
	// The Hello must come within the handshake timeout (a timer: gRPC
	// clears the connection's deadlines once it lets go of it). Then
	// nothing times out: a session is held for as long as the node
	// lives, and TCP keepalive finds a node that vanished.
	hello := time.AfterFunc(s.cfg.Limits.HandshakeTimeout, func() { _ = conn.Close() })
	caller, err := s.nodeFromPeer(ctx)
	if err != nil {
		hello.Stop()
		end(err)
		return
	}
	first, err := s.recvFramed(ctx, fs)
	if !hello.Stop() {
		_ = conn.Close()
		return
	}
	if err != nil {
		end(err)
		return
	}
	sess, err := s.gateway.open(ctx, caller, first, send, func(sess *session) {
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
	held = true
	go s.holdFramed(sess, fs, conn, lc, end, cancel)
}

// holdFramed reads a framed session's requests until it ends, then cleans
// up after it. It runs on a goroutine of its own so that its stack stays
// as shallow as a blocked read: the handshake and the session's opening
// (store look-ups) ran deeper on another, and each answer is made on a
// short-lived goroutine (a renewal signs and writes to the store), so a
// held session keeps the smallest stack Go gives (issue 20: memory per
// held session).
func (s *Server) holdFramed(sess *session, fs *sessionframe.Server, conn net.Conn, lc *connlimit.Conn, end func(error), cancel context.CancelFunc) {
	defer s.framed.remove(conn)
	defer cancel()
	if lc != nil {
		defer lc.ReleaseStream()
	}
	defer s.gateway.close(sess)
	answered := make(chan error, 1)
	for {
		m, err := s.recvFramed(sess.ctx, fs)
		if err == nil {
			go func() { answered <- s.gateway.onRequest(sess, m) }()
			err = <-answered
		}
		if err != nil {
			select {
			case <-sess.stopped:
				// stop's goroutine writes the last frame and closes.
			default:
				s.log.DebugContext(sess.ctx, "session closed", logkey.NodeID, sess.nodeID, logkey.Error, err)
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
