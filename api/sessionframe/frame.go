// Package sessionframe is the framed session: a node's live session with
// the control plane as length-prefixed protobuf messages straight on a
// mutual-TLS connection, instead of a gRPC stream.
//
// A held session is idle almost always, and on gRPC each costs the server
// five goroutines and an HTTP/2 connection's state. The framed session
// costs one goroutine (the reader) and no buffer while idle: a frame is
// read into a buffer of its own size and dropped, and a frame is written
// in one TLS record. The messages are gateway.v1's SessionRequest and
// SessionResponse, the same as on the gRPC Session; a node asks for the
// framed session by offering the TLS application protocol [ALPN] alone,
// and a server that does not know it refuses the handshake
// (no_application_protocol), so the node falls back to gRPC.
//
// A frame is a 4-byte big-endian length followed by that many bytes of
// one protobuf message; a length above [MaxFrame] ends the session. The
// server's last frame is a SessionResponse with a SessionEnd body, the
// status the gRPC Session would end with and the pushback its
// grpc-retry-pushback-ms trailer would carry; [Client.Recv] returns it as
// a gRPC status error ([EndError]), so a node handles both transports
// alike.
package sessionframe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
)

// ALPN is the TLS application protocol (RFC 7301) of a framed session.
const ALPN = "nodetrust-session/1"

// MaxFrame is the largest frame either end accepts: as large as the
// largest message the gRPC services take (boot evidence carries an event
// log).
const MaxFrame = 512 << 10

// headerLen is the length prefix's size.
const headerLen = 4

// ErrFrameTooLarge is returned for a frame whose length is above MaxFrame.
var ErrFrameTooLarge = fmt.Errorf("session frame longer than %d bytes", MaxFrame)

// conn is one end's framing: reads from one goroutine, writes from any,
// one at a time, each under a deadline so a peer that stops reading
// cannot hold a writer.
type conn struct {
	nc           net.Conn
	writeTimeout time.Duration
	wmu          sync.Mutex
}

func (c *conn) write(m proto.Message) error {
	size := proto.Size(m)
	if size > MaxFrame {
		return ErrFrameTooLarge
	}
	buf := make([]byte, headerLen, headerLen+size)
	binary.BigEndian.PutUint32(buf, uint32(size))
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, m)
	if err != nil {
		return fmt.Errorf("encode session frame: %w", err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.writeTimeout > 0 {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	_, err = c.nc.Write(buf)
	return err
}

// read reads one frame into m. It holds no buffer between frames.
func (c *conn) read(m proto.Message) error {
	var hdr [headerLen]byte
	if _, err := io.ReadFull(c.nc, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return ErrFrameTooLarge
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c.nc, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if err := proto.Unmarshal(body, m); err != nil {
		return fmt.Errorf("decode session frame: %w", err)
	}
	return nil
}

// Server is the server's end of a framed session on an established
// mutual-TLS connection. Recv is for one goroutine; Send and End may be
// called from any, concurrently with Recv and each other.
type Server struct {
	c    conn
	once sync.Once
}

// NewServer frames nc (whose TLS handshake negotiated ALPN). A Send that
// cannot finish within writeTimeout fails (0: no limit).
func NewServer(nc net.Conn, writeTimeout time.Duration) *Server {
	return &Server{c: conn{nc: nc, writeTimeout: writeTimeout}}
}

// Recv reads the node's next request.
func (s *Server) Recv() (*gatewayv1.SessionRequest, error) {
	m := &gatewayv1.SessionRequest{}
	if err := s.c.read(m); err != nil {
		return nil, err
	}
	return m, nil
}

// Send writes one response.
func (s *Server) Send(m *gatewayv1.SessionResponse) error { return s.c.write(m) }

// End sends the session's last frame, the status err carries (codes.OK
// for nil) and retryPushbackMs, the wait in milliseconds that the gRPC
// Session would send as its grpc-retry-pushback-ms trailer (0: none), and
// closes the connection; a Recv in progress then fails. Only the first End
// does anything.
func (s *Server) End(err error, retryPushbackMs uint32) {
	s.once.Do(func() {
		st := status.Convert(err)
		_ = s.c.write(&gatewayv1.SessionResponse{Body: &gatewayv1.SessionResponse_End{End: &gatewayv1.SessionEnd{
			Code: uint32(st.Code()), Message: st.Message(), RetryPushbackMs: retryPushbackMs,
		}}})
		_ = s.c.nc.Close()
	})
}

// EndError is a session the server ended with a status other than OK
// (its SessionEnd): the gRPC status error the gRPC Session would have
// returned — status.Code and status.Convert read it as one — with the
// server's pushback, which the gRPC Session carries in its
// grpc-retry-pushback-ms trailer instead.
type EndError struct {
	Status *status.Status
	// RetryPushback is how long the server asks the node to wait before
	// it opens another session; zero when it gave no pushback.
	RetryPushback time.Duration
}

func (e *EndError) Error() string { return e.Status.Err().Error() }

// GRPCStatus makes e a gRPC status error.
func (e *EndError) GRPCStatus() *status.Status { return e.Status }

// Client is a node's end of a framed session. Recv is for one goroutine;
// Send may be called from any.
type Client struct {
	c conn
}

// NewClient frames nc, a mutual-TLS connection whose handshake negotiated
// ALPN. A Send that cannot finish within writeTimeout fails (0: no limit).
func NewClient(nc net.Conn, writeTimeout time.Duration) *Client {
	return &Client{c: conn{nc: nc, writeTimeout: writeTimeout}}
}

// Send writes one request.
func (c *Client) Send(m *gatewayv1.SessionRequest) error { return c.c.write(m) }

// Recv reads the server's next message. The server's SessionEnd comes
// back as an *EndError, the gRPC status error it names with its pushback
// (io.EOF for codes.OK); a connection that ends without one is
// codes.Unavailable.
func (c *Client) Recv() (*gatewayv1.SessionResponse, error) {
	m := &gatewayv1.SessionResponse{}
	if err := c.c.read(m); err != nil {
		if errors.Is(err, ErrFrameTooLarge) {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return nil, status.Errorf(codes.Unavailable, "session connection lost: %v", err)
	}
	if end := m.GetEnd(); end != nil {
		if codes.Code(end.Code) == codes.OK {
			return nil, io.EOF
		}
		return nil, &EndError{
			Status:        status.New(codes.Code(end.Code), end.Message),
			RetryPushback: time.Duration(end.RetryPushbackMs) * time.Millisecond,
		}
	}
	return m, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.nc.Close() }
