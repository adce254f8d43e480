package install

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a loopback TCP connection: the server's
// with a send buffer large enough for what the tests write, the client's
// with a small receive buffer, so that its window shuts when it does not
// read.
func pair(t *testing.T) (server *net.TCPConn, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	cc, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	server, client = sc.(*net.TCPConn), cc.(*net.TCPConn)
	if err := server.SetWriteBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func TestWaitAckedWaitsForThePeersAcknowledgement(t *testing.T) {
	server, client := pair(t)
	before, err := readCounters(server)
	if err != nil {
		t.Fatal(err)
	}
	const n = 256 << 10
	if _, err := server.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	target := before.written() + n
	// The client reads nothing: its window shuts, the bytes stay queued.
	if err := waitAcked(t.Context(), server, target, 200*time.Millisecond); !errors.Is(err, errNotAcked) {
		t.Fatalf("waitAcked with the peer not reading: %v, want errNotAcked", err)
	}
	if _, err := io.ReadFull(client, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if err := waitAcked(t.Context(), server, target, 10*time.Second); err != nil {
		t.Fatalf("waitAcked once the peer read everything: %v", err)
	}
}

func TestWaitAckedFailsAtOnceOnAReset(t *testing.T) {
	server, client := pair(t)
	before, err := readCounters(server)
	if err != nil {
		t.Fatal(err)
	}
	const n = 256 << 10
	if _, err := server.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	// Closed with unread data: Linux answers with a reset, which empties
	// the server's send queue without acknowledging it.
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	// Long enough that only the reset, not the timeout, can end it in a
	// test's time.
	err = waitAcked(t.Context(), server, before.written()+n, time.Hour)
	if !errors.Is(err, errNotAcked) {
		t.Fatalf("waitAcked after a reset: %v, want errNotAcked", err)
	}
}
