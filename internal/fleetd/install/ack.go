package install

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// counters are what the kernel knows of a TCP connection's sent bytes.
type counters struct {
	// acked counts the bytes the peer acknowledged since the connection
	// opened; queued the bytes written and not yet acknowledged.
	acked, queued uint64
	// open is false once the connection was reset or closed: what is
	// queued then will never be acknowledged.
	open bool
}

// written is every byte the process handed to the kernel so far.
func (c counters) written() uint64 { return c.acked + c.queued }

type connKey struct{}

// ConnContext is an http.Server's ConnContext: it keeps the connection in
// the request's context, so that the config handler can ask the kernel
// whether the peer acknowledged the response. Without it no code burns.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// tcpConnOf finds the TCP connection under the request's connection: a
// *tls.Conn, and the wrappers that give their connection by NetConn (the
// connection limiter's).
func tcpConnOf(ctx context.Context) *net.TCPConn {
	c, _ := ctx.Value(connKey{}).(net.Conn)
	for range 8 {
		switch x := c.(type) {
		case *net.TCPConn:
			return x
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// errNotAcked is a response the peer did not acknowledge whole in time.
var errNotAcked = errors.New("the peer did not acknowledge the whole response")

// waitAcked waits until the peer acknowledged at least target bytes of the
// connection and nothing written is left unacknowledged, polling the
// kernel's counters (it has no notification for acknowledgements) until
// timeout. A connection reset before that fails at once.
func waitAcked(ctx context.Context, c *net.TCPConn, target uint64, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	pause := time.Millisecond
	for {
		n, err := readCounters(c)
		if err != nil {
			return err
		}
		if n.acked >= target && n.queued == 0 {
			return nil
		}
		if !n.open {
			return fmt.Errorf("%w: the connection closed with %d of %d bytes acknowledged", errNotAcked, n.acked, target)
		}
		t := time.NewTimer(pause)
		select {
		case <-deadline.C:
			t.Stop()
			return fmt.Errorf("%w within %s: %d bytes still queued", errNotAcked, timeout, n.queued)
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}
