package connlimit

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// harness is a Listener on loopback whose accepted connections arrive on
// a channel, and whose events are recorded.
type harness struct {
	l        *Listener
	accepted chan *Conn
	events   chan Event
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{accepted: make(chan *Conn, 64), events: make(chan Event, 64)}
	cfg.OnEvent = func(e Event) { h.events <- e }
	h.l, err = New(raw, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.l.Close() })
	go func() {
		for {
			c, err := h.l.Accept()
			if err != nil {
				return
			}
			h.accepted <- c.(*Conn)
		}
	}()
	return h
}

// dial connects from the loopback address src (127.0.0.0/8 is all
// loopback on Linux).
func (h *harness) dial(t *testing.T, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", h.l.Addr().String())
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// refusedDial dials from src and reports whether the server refused the
// connection: the dial itself failed with a reset, or the connection was
// closed at once.
func (h *harness) refusedDial(t *testing.T, src string) bool {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", h.l.Addr().String())
	if err != nil {
		return true
	}
	defer c.Close()
	return closedByServer(t, c)
}

// admitted waits for the server side of the next admitted connection.
func (h *harness) admitted(t *testing.T) *Conn {
	t.Helper()
	select {
	case c := <-h.accepted:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection was admitted")
		return nil
	}
}

func (h *harness) event(t *testing.T) Event {
	t.Helper()
	select {
	case e := <-h.events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event was reported")
		return Event{}
	}
}

// closedByServer reports whether the server closed c: a read returns EOF
// or a reset rather than timing out.
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err != nil
}

func TestPerSourceLimitRefusesTheNewcomer(t *testing.T) {
	h := newHarness(t, Config{MaxConns: 100, MaxPerSource: 2, MaxHandshakes: 100})
	h.dial(t, "127.0.0.2")
	h.admitted(t)
	h.dial(t, "127.0.0.2")
	h.admitted(t)
	if !h.refusedDial(t, "127.0.0.2") {
		t.Fatal("the third connection of one source stayed open")
	}
	if e := h.event(t); e.Displaced || e.Limit != LimitPerSource || e.Source != netip.MustParsePrefix("127.0.0.2/32") {
		t.Fatalf("event %+v, want a per-source refusal of 127.0.0.2", e)
	}
	// Another source still gets in.
	h.dial(t, "127.0.0.3")
	h.admitted(t)
	st := h.l.Stats()
	if st.Open != 3 || st.Sources != 2 || st.Refused[LimitPerSource] != 1 {
		t.Fatalf("stats %+v, want 3 open from 2 sources and 1 per-source refusal", st)
	}
}

func TestFullListenerDisplacesTheHeaviestSourcesOldestIdleConnection(t *testing.T) {
	h := newHarness(t, Config{MaxConns: 4, MaxPerSource: 10, MaxHandshakes: 100})
	var flood []net.Conn
	for range 4 {
		flood = append(flood, h.dial(t, "127.0.0.2"))
		h.admitted(t).Established()
	}
	h.dial(t, "127.0.0.3")
	h.admitted(t)
	if e := h.event(t); !e.Displaced || e.Limit != LimitTotal || e.Source != netip.MustParsePrefix("127.0.0.2/32") {
		t.Fatalf("event %+v, want 127.0.0.2 displaced by the total limit", e)
	}
	if !closedByServer(t, flood[0]) {
		t.Fatal("the oldest connection of the heaviest source was not closed")
	}
	if st := h.l.Stats(); st.Open != 4 || st.Displaced[LimitTotal] != 1 {
		t.Fatalf("stats %+v, want 4 open and one displacement", st)
	}
}

func TestConnectionsCarryingAStreamAreNeverDisplaced(t *testing.T) {
	h := newHarness(t, Config{MaxConns: 3, MaxPerSource: 10, MaxHandshakes: 100})
	var held []net.Conn
	for range 3 {
		held = append(held, h.dial(t, "127.0.0.2"))
		c := h.admitted(t)
		c.Established()
		c.streamDelta(1)
	}
	if !h.refusedDial(t, "127.0.0.3") {
		t.Fatal("the newcomer was not refused")
	}
	if e := h.event(t); e.Displaced || e.Limit != LimitTotal {
		t.Fatalf("event %+v, want the newcomer refused by the total limit", e)
	}
	for i, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
			t.Fatalf("connection %d with a stream was closed: %v", i, err)
		}
	}
}

func TestHandshakeLimitDisplacesOnlyUnfinishedHandshakes(t *testing.T) {
	h := newHarness(t, Config{MaxConns: 100, MaxPerSource: 100, MaxHandshakes: 2})
	done := h.dial(t, "127.0.0.2")
	h.admitted(t).Established()
	var stalled []net.Conn
	for range 2 {
		stalled = append(stalled, h.dial(t, "127.0.0.2"))
		h.admitted(t)
	}
	if st := h.l.Stats(); st.Handshaking != 2 || st.Open != 3 {
		t.Fatalf("stats %+v, want 2 handshaking of 3 open", st)
	}
	h.dial(t, "127.0.0.4")
	h.admitted(t)
	if e := h.event(t); !e.Displaced || e.Limit != LimitHandshakes {
		t.Fatalf("event %+v, want a displacement by the handshake limit", e)
	}
	if !closedByServer(t, stalled[0]) {
		t.Fatal("the oldest stalled handshake was not closed")
	}
	_ = done.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := done.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("an established connection was closed: %v", err)
	}
	// Alone at the limit, a source is refused, not displaced by itself.
	if !h.refusedDial(t, "127.0.0.4") {
		t.Fatal("a newcomer over the handshake limit was admitted")
	}
	if e := h.event(t); e.Displaced || e.Limit != LimitHandshakes {
		t.Fatalf("event %+v, want a refusal by the handshake limit", e)
	}
}

func TestCloseGivesThePlaceBack(t *testing.T) {
	h := newHarness(t, Config{MaxConns: 1, MaxPerSource: 1, MaxHandshakes: 1})
	h.dial(t, "127.0.0.2")
	c := h.admitted(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.Close() // a second Close gives nothing back twice
	if st := h.l.Stats(); st.Open != 0 || st.Handshaking != 0 || st.Sources != 0 {
		t.Fatalf("stats after close %+v, want nothing held", st)
	}
	h.dial(t, "127.0.0.2")
	h.admitted(t)
}

func TestSourceOfGroupsIPv6By64(t *testing.T) {
	cases := []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}, "192.0.2.7/32"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}, "192.0.2.7/32"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 1}, "2001:db8:1:2::/64"},
	}
	for _, c := range cases {
		if got := SourceOf(c.addr); got.String() != c.want {
			t.Errorf("SourceOf(%v) = %v, want %s", c.addr, got, c.want)
		}
	}
}

func TestNewRefusesZeroLimits(t *testing.T) {
	if _, err := New(nil, Config{MaxConns: 1, MaxPerSource: 0, MaxHandshakes: 1}); err == nil {
		t.Fatal("New accepted a zero per-source limit")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, io.EOF)
}
