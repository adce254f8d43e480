package connlimit

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/stats"
)

// Config bounds a Listener. Every limit must be positive.
type Config struct {
	// MaxConns is the most connections held at once.
	MaxConns int
	// MaxPerSource is the most connections one source holds: an IPv4
	// address, or an IPv6 /64 (one host's usual share).
	MaxPerSource int
	// MaxHandshakes is the most connections held whose handshake has not
	// finished: those that have proved nothing yet.
	MaxHandshakes int
	// OnEvent, when set, is told of every refusal and displacement. It is
	// called without the Listener's lock held and must not block.
	OnEvent func(Event)
}

// Limit names the limit an Event is about.
type Limit string

// The limits.
const (
	LimitTotal      Limit = "total"
	LimitPerSource  Limit = "per_source"
	LimitHandshakes Limit = "handshakes"
)

// Event is a connection refused or displaced because of Limit.
type Event struct {
	// Displaced is true when an idle connection of Source was closed to
	// make room for another source's; false when a new connection of
	// Source was refused.
	Displaced bool
	Limit     Limit
	// Source is the source's address (an IPv6 source as its /64).
	Source netip.Prefix
}

// Stats are a Listener's counts at one moment.
type Stats struct {
	Open        int
	Handshaking int
	Sources     int
	// Refused and Displaced count since the Listener was made, by limit.
	Refused   map[Limit]uint64
	Displaced map[Limit]uint64
}

// Listener is a net.Listener that holds at most its Config's connections.
// Its Accept refuses (resets) connections over a limit and returns the
// others wrapped, so that their Close gives their place back.
type Listener struct {
	net.Listener
	cfg Config

	mu          sync.Mutex
	total       int
	handshaking int
	sources     map[netip.Prefix]*source
	byRemote    map[string]*Conn

	refused   [3]atomic.Uint64
	displaced [3]atomic.Uint64
}

// source is one source address's connections, oldest first.
type source struct {
	key     netip.Prefix
	conns   []*Conn
	pending int // of conns, those still in their handshake
}

// Conn is a connection a Listener accepted.
type Conn struct {
	net.Conn
	l      *Listener
	src    *source
	remote string
	// Guarded by l.mu.
	established bool
	streams     int
	gone        bool
}

// New wraps ln. It fails when a limit is not positive.
func New(ln net.Listener, cfg Config) (*Listener, error) {
	if cfg.MaxConns <= 0 || cfg.MaxPerSource <= 0 || cfg.MaxHandshakes <= 0 {
		return nil, errors.New("connlimit: MaxConns, MaxPerSource and MaxHandshakes must be positive")
	}
	return &Listener{Listener: ln, cfg: cfg, sources: map[netip.Prefix]*source{}, byRemote: map[string]*Conn{}}, nil
}

func limitIndex(l Limit) int {
	switch l {
	case LimitPerSource:
		return 1
	case LimitHandshakes:
		return 2
	}
	return 0
}

// Accept returns the next connection within the limits. Connections over
// a limit are reset and counted, and Accept waits for the next one.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := SourceOf(raw.RemoteAddr())
		c, victim, limit := l.admit(raw, key)
		if victim != nil {
			l.displaced[limitIndex(limit)].Add(1)
			reset(victim.Conn)
			l.report(Event{Displaced: true, Limit: limit, Source: victim.src.key})
		}
		if c == nil {
			l.refused[limitIndex(limit)].Add(1)
			reset(raw)
			l.report(Event{Limit: limit, Source: key})
			continue
		}
		return c, nil
	}
}

func (l *Listener) report(e Event) {
	if l.cfg.OnEvent != nil {
		l.cfg.OnEvent(e)
	}
}

// admit takes raw in, perhaps in place of a victim it took out; or, when
// no fair victim exists, refuses it and names the limit.
func (l *Listener) admit(raw net.Conn, key netip.Prefix) (c, victim *Conn, limit Limit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sources[key]
	held := 0
	if s != nil {
		held = len(s.conns)
	}
	if held >= l.cfg.MaxPerSource {
		return nil, nil, LimitPerSource
	}
	switch {
	case l.handshaking >= l.cfg.MaxHandshakes:
		limit = LimitHandshakes
		victim = l.victimLocked(key, true)
	case l.total >= l.cfg.MaxConns:
		limit = LimitTotal
		victim = l.victimLocked(key, false)
	}
	if limit != "" && victim == nil {
		return nil, nil, limit
	}
	if victim != nil {
		l.removeLocked(victim)
	}
	if s == nil {
		s = &source{key: key}
		l.sources[key] = s
	}
	c = &Conn{Conn: raw, l: l, src: s, remote: raw.RemoteAddr().String()}
	s.conns = append(s.conns, c)
	s.pending++
	l.total++
	l.handshaking++
	l.byRemote[c.remote] = c
	return c, victim, limit
}

// victimLocked picks the connection a newcomer from key displaces: the
// oldest idle connection (still in its handshake, when pending) of the
// source that holds the most such connections, if it holds at least two
// more than key's source does. Connections carrying a stream are never
// picked.
func (l *Listener) victimLocked(key netip.Prefix, pending bool) *Conn {
	count := func(s *source) int {
		if s == nil {
			return 0
		}
		if pending {
			return s.pending
		}
		return len(s.conns)
	}
	mine := count(l.sources[key])
	var best *source
	var victim *Conn
	for k, s := range l.sources {
		n := count(s)
		if k == key || n < mine+2 || (best != nil && n <= count(best)) {
			continue
		}
		for _, c := range s.conns {
			if c.streams == 0 && (!pending || !c.established) {
				best, victim = s, c
				break
			}
		}
	}
	return victim
}

// removeLocked gives c's place back; it is idempotent.
func (l *Listener) removeLocked(c *Conn) {
	if c.gone {
		return
	}
	c.gone = true
	s := c.src
	for i, x := range s.conns {
		if x == c {
			s.conns = append(s.conns[:i], s.conns[i+1:]...)
			break
		}
	}
	if !c.established {
		s.pending--
		l.handshaking--
	}
	l.total--
	if len(s.conns) == 0 {
		delete(l.sources, s.key)
	}
	if l.byRemote[c.remote] == c {
		delete(l.byRemote, c.remote)
	}
}

// Close closes the connection and gives its place back.
func (c *Conn) Close() error {
	c.l.mu.Lock()
	c.l.removeLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// NetConn returns the connection the listener accepted, as tls.Conn's
// NetConn does: the config release asks the kernel, through it, whether
// its response was acknowledged. Reading or writing it bypasses nothing
// the Conn counts, but closing it does not give the place back: Close the
// Conn.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// Established marks the connection's handshake finished: it no longer
// counts against MaxHandshakes.
func (c *Conn) Established() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.established || c.gone {
		return
	}
	c.established = true
	c.src.pending--
	c.l.handshaking--
}

// streamDelta adds d to the connection's streams in progress.
func (c *Conn) streamDelta(d int) {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	c.streams = max(c.streams+d, 0)
}

// HoldStream counts a stream on the connection until ReleaseStream, for a
// connection served outside gRPC (a framed session): one carrying a
// stream is never displaced.
func (c *Conn) HoldStream() { c.streamDelta(1) }

// ReleaseStream ends what HoldStream began.
func (c *Conn) ReleaseStream() { c.streamDelta(-1) }

// lookup finds an accepted connection by its remote address.
func (l *Listener) lookup(remote net.Addr) *Conn {
	if remote == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byRemote[remote.String()]
}

// Stats returns the Listener's counts now.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	st := Stats{Open: l.total, Handshaking: l.handshaking, Sources: len(l.sources)}
	l.mu.Unlock()
	st.Refused, st.Displaced = map[Limit]uint64{}, map[Limit]uint64{}
	for _, lim := range []Limit{LimitTotal, LimitPerSource, LimitHandshakes} {
		st.Refused[lim] = l.refused[limitIndex(lim)].Load()
		st.Displaced[lim] = l.displaced[limitIndex(lim)].Load()
	}
	return st
}

// SourceOf is the source a connection from addr counts against: its IPv4
// address, or its IPv6 /64.
func SourceOf(addr net.Addr) netip.Prefix {
	var ip netip.Addr
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		if ap, err := netip.ParseAddrPort(addr.String()); err == nil {
			ip = ap.Addr()
		}
	}
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return netip.Prefix{}
	}
	return p
}

// reset closes c at once, with a TCP reset when it is TCP, so that a
// refused connection leaves no TIME_WAIT state behind on the server.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// Credentials wraps a gRPC server's transport credentials so that a
// connection whose handshake succeeded stops counting as handshaking.
func (l *Listener) Credentials(inner credentials.TransportCredentials) credentials.TransportCredentials {
	return &creds{TransportCredentials: inner, l: l}
}

type creds struct {
	credentials.TransportCredentials
	l *Listener
}

func (c *creds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err == nil {
		if lc, ok := raw.(*Conn); ok {
			lc.Established()
		}
	}
	return conn, info, err
}

func (c *creds) Clone() credentials.TransportCredentials {
	return &creds{TransportCredentials: c.TransportCredentials.Clone(), l: c.l}
}

// StatsHandler tells the Listener which gRPC connections carry a stream
// (a call in flight or a live session), so that they are never displaced.
func (l *Listener) StatsHandler() stats.Handler { return statsHandler{l} }

type statsHandler struct{ l *Listener }

type connKey struct{}

func (h statsHandler) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if c := h.l.lookup(info.RemoteAddr); c != nil {
		return context.WithValue(ctx, connKey{}, c)
	}
	return ctx
}

func (statsHandler) HandleConn(context.Context, stats.ConnStats) {}

func (statsHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (statsHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	c, _ := ctx.Value(connKey{}).(*Conn)
	if c == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		c.streamDelta(1)
	case *stats.End:
		c.streamDelta(-1)
	}
}

// ConnState is an http.Server's ConnState hook: a connection that served
// a request is established, and one serving a request carries a stream.
func (l *Listener) ConnState(nc net.Conn, st http.ConnState) {
	if st != http.StateActive && st != http.StateIdle {
		return
	}
	c := l.lookup(nc.RemoteAddr())
	if c == nil {
		return
	}
	c.Established()
	c.l.mu.Lock()
	if st == http.StateActive {
		c.streams = 1
	} else {
		c.streams = 0
	}
	c.l.mu.Unlock()
}
