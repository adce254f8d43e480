package install_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodetrust/nodetrust/internal/fleetd/connlimit"
	"github.com/nodetrust/nodetrust/internal/fleetd/install"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/postgres"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/postgres/pgtest"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const machine = "4C4C4544-0042-3010-8056-B2C04F4E3732"

// clock is a settable clock shared by the releaser and the lifecycle.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// env is a releaser on a real store behind a real HTTPS server on
// loopback, with its log captured.
type env struct {
	t        *testing.T
	store    store.Store
	rel      *install.Releaser
	reg      *prometheus.Registry
	srv      *httptest.Server
	clock    *clock
	logs     *lockedBuffer
	outcomes chan string
	// secrets must never appear in the log: every code issued and every
	// config's marker.
	secrets []string
}

type option func(*install.Config, *httptest.Server)

func sqliteStore(t *testing.T, path string) store.Store {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "fleetd.db")
	}
	db, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func postgresStore(t *testing.T) store.Store {
	t.Helper()
	c := pgtest.Start(t)
	db, err := postgres.Open(t.Context(), c.NewSchema(t), postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// newEnv serves a releaser on s (closed when the test ends) from time
// now.
func newEnv(t *testing.T, s store.Store, clk *clock, opts ...option) *env {
	t.Helper()
	if clk == nil {
		clk = &clock{t: time.Now()}
	}
	e := &env{t: t, store: s, clock: clk, logs: &lockedBuffer{}, outcomes: make(chan string, 100), reg: prometheus.NewRegistry()}
	log := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := install.Config{Store: s, Logger: log, Registry: e.reg, Now: clk.Now,
		Activator: install.LifecycleActivator{Manager: &lifecycle.Manager{Store: s, TrustDomain: "example.org", Now: clk.Now}}}
	e.srv = httptest.NewUnstartedServer(nil)
	for _, o := range opts {
		o(&cfg, e.srv)
	}
	rel, err := install.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	install.SetObserve(rel, func(o string) { e.outcomes <- o })
	e.rel = rel
	e.srv.Config.Handler = rel.Handler()
	e.srv.Config.ConnContext = install.ConnContext
	e.srv.StartTLS()
	t.Cleanup(func() {
		e.srv.Close()
		if err := s.Close(); err != nil {
			t.Errorf("close the store: %v", err)
		}
		logs := e.logs.String()
		for _, sec := range e.secrets {
			if strings.Contains(logs, sec) {
				t.Errorf("the log holds a secret (a code or a config):\n%s", logs)
			}
		}
	})
	return e
}

// provisioning writes a provisioning node id, as admission would.
func (e *env) provisioning(id string) {
	e.t.Helper()
	_, _, err := e.store.TransitionNode(e.t.Context(), store.Transition{NodeID: id, From: []string{store.StatePlanned}, To: store.StateProvisioning,
		Create: &store.Node{ID: id, State: store.StatePlanned, Generation: 1, Role: "worker"}, Time: e.clock.Now(), Actor: "test", Reason: "provision"})
	if err != nil {
		e.t.Fatal(err)
	}
}

// config is a rendered config of size bytes carrying a marker that must
// never be logged.
func (e *env) config(size int) []byte {
	marker := fmt.Sprintf("CONFIG-MARKER-%d-%d", len(e.secrets), size)
	e.secrets = append(e.secrets, marker)
	b := bytes.Repeat([]byte("machine:\n  install: {disk: /dev/sda}\n"), size/37+1)
	copy(b, marker)
	return b[:size]
}

// issue renders config for node web-1 on machine and returns the code.
func (e *env) issue(config []byte) install.Code {
	e.t.Helper()
	code, _, err := e.rel.Issue(e.t.Context(), install.Render{UUID: machine, NodeID: "web-1", Config: config, ContentType: "application/yaml", Actor: "test"})
	if err != nil {
		e.t.Fatal(err)
	}
	e.secrets = append(e.secrets, code.Bearer())
	return code
}

type response struct {
	status int
	body   []byte
	header http.Header
}

// get fetches uuid's config with authorization (none when empty) on a
// connection of its own, and waits for the fetch's outcome.
func (e *env) get(uuid, authorization string) (response, string) {
	e.t.Helper()
	r := e.send(uuid, authorization, nil)
	return r, e.outcome()
}

func (e *env) send(uuid, authorization string, body io.Reader) response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.t.Context(), http.MethodGet, e.srv.URL+install.ConfigPath(uuid), body)
	if err != nil {
		e.t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	req.Close = true
	rsp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("GET %s: %v", uuid, err)
	}
	defer rsp.Body.Close()
	b, err := io.ReadAll(rsp.Body)
	if err != nil {
		e.t.Fatalf("GET %s: read the body: %v", uuid, err)
	}
	return response{status: rsp.StatusCode, body: b, header: rsp.Header}
}

func (e *env) outcome() string {
	e.t.Helper()
	select {
	case o := <-e.outcomes:
		return o
	case <-e.t.Context().Done():
		e.t.Fatal("no fetch outcome before the test ended")
		return ""
	}
}

func bearer(c install.Code) string { return "Bearer " + c.Bearer() }

func (e *env) wantFetches(outcome string, n int) {
	e.t.Helper()
	if got := counter(e.t, e.reg, "nodetrust_config_fetches_total", outcome); got != float64(n) {
		e.t.Errorf("nodetrust_config_fetches_total{outcome=%q} = %v, want %d", outcome, got, n)
	}
}

// counter reads name{outcome} from reg; 0 when it has no such series.
func counter(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func (e *env) node(id string) store.Node {
	e.t.Helper()
	n, err := e.store.GetNode(e.t.Context(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// limited serves through fleetd's connection limiter, as its HTTPS
// listener does: the release finds the TCP connection under it.
func limited(t *testing.T) option {
	return func(_ *install.Config, s *httptest.Server) {
		lim, err := connlimit.New(s.Listener, connlimit.Config{MaxConns: 100, MaxPerSource: 100, MaxHandshakes: 100})
		if err != nil {
			t.Fatal(err)
		}
		s.Listener = lim
		s.Config.ConnState = lim.ConnState
	}
}

func TestAConfigIsReleasedOnceAndItsNodeBecomesActive(t *testing.T) {
	cases := []struct {
		name string
		opts []option
	}{
		{"HTTP/1.1", nil},
		{"HTTP/2", []option{func(_ *install.Config, s *httptest.Server) { s.EnableHTTP2 = true }}},
		{"through the connection limiter", []option{limited(t)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, sqliteStore(t, ""), nil, c.opts...)
			e.provisioning("web-1")
			config := e.config(300 << 10)
			code := e.issue(config)

			r, outcome := e.get(strings.ToLower(machine), bearer(code))
			if r.status != http.StatusOK || !bytes.Equal(r.body, config) || outcome != install.OutcomeReleased {
				t.Fatalf("first fetch: %d, %d bytes, outcome %s; want 200 with the config, released", r.status, len(r.body), outcome)
			}
			if ct, cc := r.header.Get("Content-Type"), r.header.Get("Cache-Control"); ct != "application/yaml" || cc != "no-store" {
				t.Errorf("Content-Type %q, Cache-Control %q", ct, cc)
			}
			rel, err := e.store.GetConfigRelease(t.Context(), strings.ToLower(machine))
			if err != nil {
				t.Fatal(err)
			}
			if rel.State != store.ReleaseBurned || rel.Sealed != nil {
				t.Fatalf("after the release: state %s, %d sealed bytes; want burned and none", rel.State, len(rel.Sealed))
			}
			// Spent: the same code again is 410 Gone.
			r, outcome = e.get(machine, bearer(code))
			if r.status != http.StatusGone || outcome != install.OutcomeSpent || !strings.Contains(string(r.body), "spent") {
				t.Fatalf("second fetch: %d %q, outcome %s; want 410 spent", r.status, r.body, outcome)
			}
			// The sweep activates the node and settles the release.
			if n, err := e.rel.Sweep(t.Context()); err != nil || n != 1 {
				t.Fatalf("Sweep: %d settled, %v; want 1", n, err)
			}
			if st := e.node("web-1").State; st != store.StateActive {
				t.Fatalf("node web-1 is %s after its release, want active", st)
			}
			if rel, _ := e.store.GetConfigRelease(t.Context(), strings.ToLower(machine)); rel.Activation != install.ActivationActive {
				t.Fatalf("release activation %q, want active", rel.Activation)
			}
			if n, err := e.rel.Sweep(t.Context()); err != nil || n != 0 {
				t.Fatalf("second Sweep: %d settled, %v; want nothing left", n, err)
			}
			e.wantFetches(install.OutcomeReleased, 1)
			e.wantFetches(install.OutcomeSpent, 1)
			// The log is captured (and checked for the code and the config
			// when the test ends).
			if logs := e.logs.String(); !strings.Contains(logs, "config released: install code burned") || !strings.Contains(logs, "node active after its config release") {
				t.Errorf("the log misses the release or the activation:\n%s", logs)
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	e := newEnv(t, sqliteStore(t, ""), nil)
	code := e.issue(e.config(1000))
	other, err := install.NewCode(nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name          string
		uuid, auth    string
		body          io.Reader
		status        int
		outcome       string
		authenticates bool
	}{
		{"no credential", machine, "", nil, http.StatusUnauthorized, install.OutcomeUnauthorized, true},
		{"another scheme", machine, "Basic " + code.Bearer(), nil, http.StatusUnauthorized, install.OutcomeUnauthorized, true},
		{"a malformed code", machine, "Bearer abc", nil, http.StatusUnauthorized, install.OutcomeUnauthorized, true},
		{"a wrong code", machine, bearer(other), nil, http.StatusUnauthorized, install.OutcomeUnauthorized, true},
		{"an unknown machine, answered as a wrong code", "0000-unknown", bearer(code), nil, http.StatusUnauthorized, install.OutcomeUnauthorized, true},
		{"a malformed machine UUID", "a%20b", bearer(code), nil, http.StatusBadRequest, install.OutcomeBadRequest, false},
		{"a body", machine, bearer(code), strings.NewReader("x"), http.StatusBadRequest, install.OutcomeBadRequest, false},
	}
	for _, c := range cases {
		r := e.send(c.uuid, c.auth, c.body)
		if o := e.outcome(); r.status != c.status || o != c.outcome {
			t.Errorf("%s: %d (%s), want %d (%s)", c.name, r.status, o, c.status, c.outcome)
		}
		if got := r.header.Get("WWW-Authenticate") != ""; got != (c.status == http.StatusUnauthorized) {
			t.Errorf("%s: WWW-Authenticate %q", c.name, r.header.Get("WWW-Authenticate"))
		}
	}
	// None of them spent or claimed anything.
	if r, o := e.get(machine, bearer(code)); r.status != http.StatusOK || o != install.OutcomeReleased {
		t.Fatalf("the right code after the refusals: %d, %s", r.status, o)
	}
}

// Twenty fetches at once with the same code: exactly one gets the config;
// the others are told another fetch holds it (409, with a retry hint) or
// that the code was spent (410).
func TestConcurrentFetchesReleaseOnce(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) store.Store{
		"sqlite":   func(t *testing.T) store.Store { return sqliteStore(t, "") },
		"postgres": postgresStore,
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, open(t), nil)
			config := e.config(256 << 10)
			code := e.issue(config)
			const n = 20
			rs := make([]response, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					rs[i] = e.send(machine, bearer(code), nil)
				})
			}
			close(start)
			wg.Wait()
			outcomes := map[string]int{}
			for range n {
				outcomes[e.outcome()]++
			}
			got := 0
			for i, r := range rs {
				switch r.status {
				case http.StatusOK:
					got++
					if !bytes.Equal(r.body, config) {
						t.Errorf("fetch %d: 200 with %d bytes that are not the config", i, len(r.body))
					}
				case http.StatusConflict:
					if r.header.Get("Retry-After") == "" {
						t.Errorf("fetch %d: 409 without Retry-After", i)
					}
				case http.StatusGone:
				default:
					t.Errorf("fetch %d: %d %q", i, r.status, r.body)
				}
			}
			if got != 1 || outcomes[install.OutcomeReleased] != 1 || outcomes[install.OutcomeBusy]+outcomes[install.OutcomeSpent] != n-1 {
				t.Fatalf("%d fetches got the config, outcomes %v; want exactly one released, the others busy or spent", got, outcomes)
			}
		})
	}
}

// tlsDial opens a TLS connection to e's server; rcvbuf, when not 0, is
// the socket's receive buffer, set before it connects.
func (e *env) tlsDial(rcvbuf int) *tls.Conn {
	e.t.Helper()
	d := &net.Dialer{}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf) }); err != nil {
				return err
			}
			return serr
		}
	}
	tc := e.srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	tc.NextProtos = []string{"http/1.1"}
	conn, err := tls.DialWithDialer(d, "tcp", e.srv.Listener.Addr().String(), tc)
	if err != nil {
		e.t.Fatal(err)
	}
	return conn
}

func (e *env) writeRequest(conn *tls.Conn, code install.Code) {
	e.t.Helper()
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: fleetd\r\nAuthorization: %s\r\n\r\n", install.ConfigPath(machine), bearer(code)); err != nil {
		e.t.Fatal(err)
	}
}

// A response that stops early leaves the code valid: a retry gets the
// config.
func TestAResponseCutEarlyLeavesTheCodeValid(t *testing.T) {
	cases := []struct {
		name string
		size int
		// cut reads part of the response (or none) and ends the
		// connection, after the server gave up on it when wait is set.
		cut  func(e *env, conn *tls.Conn)
		opts []option
	}{
		{"the client closes after 1000 bytes", 8 << 20, func(e *env, conn *tls.Conn) {
			if _, err := io.ReadFull(conn, make([]byte, 1000)); err != nil {
				e.t.Fatal(err)
			}
			conn.Close()
		}, nil},
		{"the client never reads and its window stays shut", 64 << 10, nil, []option{func(c *install.Config, _ *httptest.Server) {
			c.WriteTimeout, c.AckTimeout = 2*time.Second, 500*time.Millisecond
		}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, sqliteStore(t, ""), nil, c.opts...)
			config := e.config(c.size)
			code := e.issue(config)
			conn := e.tlsDial(4096)
			e.writeRequest(conn, code)
			if c.cut != nil {
				c.cut(e, conn)
			}
			o := e.outcome()
			conn.Close()
			if o != install.OutcomeWriteFailed && o != install.OutcomeUnacknowledged {
				t.Fatalf("outcome %s, want write_failed or unacknowledged", o)
			}
			rel, err := e.store.GetConfigRelease(t.Context(), strings.ToLower(machine))
			if err != nil || rel.State != store.ReleaseReady {
				t.Fatalf("after the cut: %+v, %v; want ready", rel.State, err)
			}
			if r, o := e.get(machine, bearer(code)); r.status != http.StatusOK || !bytes.Equal(r.body, config) || o != install.OutcomeReleased {
				t.Fatalf("retry: %d, %d bytes, %s; want the config", r.status, len(r.body), o)
			}
		})
	}
}

// A fetch whose claim lapsed (its fleetd died mid-response) gives way; a
// live claim answers 409 with how long to wait.
func TestAHeldClaimAnswersBusyUntilItLapses(t *testing.T) {
	clk := &clock{t: time.Now()}
	e := newEnv(t, sqliteStore(t, ""), clk)
	code := e.issue(e.config(1000))
	uuid := strings.ToLower(machine)
	if err := e.store.ClaimConfigRelease(t.Context(), uuid, 1, "dead-replica", clk.Now(), clk.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	r, o := e.get(machine, bearer(code))
	if r.status != http.StatusConflict || o != install.OutcomeBusy || r.header.Get("Retry-After") != "30" {
		t.Fatalf("fetch during a claim: %d, %s, Retry-After %q; want 409, busy, 30", r.status, o, r.header.Get("Retry-After"))
	}
	clk.Add(30 * time.Second)
	if r, o := e.get(machine, bearer(code)); r.status != http.StatusOK || o != install.OutcomeReleased {
		t.Fatalf("fetch once the claim lapsed: %d, %s", r.status, o)
	}
}

func TestAnExpiredCodeIsGone(t *testing.T) {
	clk := &clock{t: time.Now()}
	e := newEnv(t, sqliteStore(t, ""), clk, func(c *install.Config, _ *httptest.Server) { c.TTL = time.Hour })
	code := e.issue(e.config(1000))
	clk.Add(time.Hour)
	r, o := e.get(machine, bearer(code))
	if r.status != http.StatusGone || o != install.OutcomeExpired || !strings.Contains(string(r.body), "expired") {
		t.Fatalf("fetch at the expiry: %d %q, %s; want 410 expired", r.status, r.body, o)
	}
	// The sweep drops the sealed config; the code stays answered as
	// expired.
	if _, err := e.rel.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if rel, _ := e.store.GetConfigRelease(t.Context(), strings.ToLower(machine)); rel.Sealed != nil {
		t.Fatal("the sweep left the expired sealed config")
	}
	if r, o := e.get(machine, bearer(code)); r.status != http.StatusGone || o != install.OutcomeExpired {
		t.Fatalf("fetch after the purge: %d, %s", r.status, o)
	}
}

func TestARenderInvalidatesTheEarlierCode(t *testing.T) {
	e := newEnv(t, sqliteStore(t, ""), nil)
	first := e.issue(e.config(1000))
	second := e.config(2000)
	code := e.issue(second)
	if r, o := e.get(machine, bearer(first)); r.status != http.StatusUnauthorized || o != install.OutcomeUnauthorized {
		t.Fatalf("the earlier code: %d, %s; want 401", r.status, o)
	}
	if r, o := e.get(machine, bearer(code)); r.status != http.StatusOK || !bytes.Equal(r.body, second) || o != install.OutcomeReleased {
		t.Fatalf("the new code: %d, %s", r.status, o)
	}
}

// Rendered, then fleetd restarts (the store closed and opened again, a new
// releaser): the code still fetches the config, once.
func TestAReleaseSurvivesARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleetd.db")
	var code install.Code
	config := []byte("machine:\n  type: worker\n")
	func() {
		s := sqliteStore(t, path)
		defer s.Close()
		rel, err := install.New(install.Config{Store: s, Logger: slog.New(slog.DiscardHandler), Activator: install.LifecycleActivator{Manager: &lifecycle.Manager{Store: s}}})
		if err != nil {
			t.Fatal(err)
		}
		if code, _, err = rel.Issue(t.Context(), install.Render{UUID: machine, NodeID: "web-1", Config: config}); err != nil {
			t.Fatal(err)
		}
	}()
	e := newEnv(t, sqliteStore(t, path), nil)
	e.secrets = append(e.secrets, code.Bearer())
	if r, o := e.get(machine, bearer(code)); r.status != http.StatusOK || !bytes.Equal(r.body, config) || o != install.OutcomeReleased {
		t.Fatalf("fetch after the restart: %d, %s", r.status, o)
	}
	if r, o := e.get(machine, bearer(code)); r.status != http.StatusGone || o != install.OutcomeSpent {
		t.Fatalf("second fetch after the restart: %d, %s; want 410 spent", r.status, o)
	}
}

// A failed state update after the release is retried, not lost.
func TestAFailedActivationIsRetried(t *testing.T) {
	f := storefault.New(sqliteStore(t, ""))
	e := newEnv(t, f, nil)
	e.provisioning("web-1")
	code := e.issue(e.config(1000))
	if r, o := e.get(machine, bearer(code)); r.status != http.StatusOK || o != install.OutcomeReleased {
		t.Fatalf("fetch: %d, %s", r.status, o)
	}
	f.FailNext("TransitionNode", store.ErrUnavailable)
	if n, err := e.rel.Sweep(t.Context()); err != nil || n != 0 {
		t.Fatalf("Sweep with the store failing: %d settled, %v; want none settled and no sweep error", n, err)
	}
	rel, err := e.store.GetConfigRelease(t.Context(), strings.ToLower(machine))
	if err != nil || rel.Activation != "" || rel.ActivationAttempts != 1 || !strings.Contains(rel.ActivationError, "unavailable") {
		t.Fatalf("after the failed attempt: %+v, %v", rel, err)
	}
	if st := e.node("web-1").State; st != store.StateProvisioning {
		t.Fatalf("node is %s, want still provisioning", st)
	}
	if n, err := e.rel.Sweep(t.Context()); err != nil || n != 1 {
		t.Fatalf("retry: %d settled, %v", n, err)
	}
	if st := e.node("web-1").State; st != store.StateActive {
		t.Fatalf("node is %s after the retry, want active", st)
	}
}

// A node quarantined between the render and the release is not made
// active, and the sweep stops trying.
func TestAQuarantinedNodeIsNotActivated(t *testing.T) {
	e := newEnv(t, sqliteStore(t, ""), nil)
	e.provisioning("web-1")
	code := e.issue(e.config(1000))
	m := &lifecycle.Manager{Store: e.store, Now: e.clock.Now}
	if _, err := m.Quarantine(t.Context(), "web-1", "test", "suspicious", ""); err != nil {
		t.Fatal(err)
	}
	if r, o := e.get(machine, bearer(code)); r.status != http.StatusOK || o != install.OutcomeReleased {
		t.Fatalf("fetch: %d, %s", r.status, o)
	}
	if n, err := e.rel.Sweep(t.Context()); err != nil || n != 1 {
		t.Fatalf("Sweep: %d, %v", n, err)
	}
	if st := e.node("web-1").State; st != store.StateQuarantined {
		t.Fatalf("node is %s, want still quarantined", st)
	}
	rel, _ := e.store.GetConfigRelease(t.Context(), strings.ToLower(machine))
	if rel.Activation != "not activated: node is quarantined" {
		t.Fatalf("settled as %q", rel.Activation)
	}
}

func TestACodeIsNeverFormattedOrLogged(t *testing.T) {
	code, err := install.NewCode(nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "code", code)
	for _, s := range []string{fmt.Sprint(code), fmt.Sprintf("%v %+v %#v %s %x %q", code, code, code, code, code, code), buf.String()} {
		if strings.Contains(s, code.Bearer()) || strings.Contains(s, fmt.Sprintf("%x", code[:])) || !strings.Contains(s, "install code") {
			t.Errorf("a formatted code shows it: %s", s)
		}
	}
	back, err := install.ParseCode(code.Bearer())
	if err != nil || back != code {
		t.Fatalf("ParseCode(Bearer()): %v", err)
	}
	for _, bad := range []string{"", code.Bearer() + "A", code.Bearer()[:42] + "=", strings.Repeat("!", 43)} {
		if _, err := install.ParseCode(bad); !errors.Is(err, install.ErrMalformedCode) {
			t.Errorf("ParseCode(%q): %v", bad, err)
		}
	}
}

// The store holds nothing usable without the code: neither the code nor
// the config in the clear.
func TestTheStoreHoldsNoCodeAndNoClearConfig(t *testing.T) {
	e := newEnv(t, sqliteStore(t, ""), nil)
	config := e.config(5000)
	code := e.issue(config)
	rel, err := e.store.GetConfigRelease(t.Context(), strings.ToLower(machine))
	if err != nil {
		t.Fatal(err)
	}
	row := fmt.Sprintf("%+v", rel)
	if bytes.Contains(rel.Sealed, config[:64]) || bytes.Contains(rel.Sealed, code[:]) || bytes.Contains(rel.Verifier, code[:]) ||
		strings.Contains(row, code.Bearer()) {
		t.Fatal("the stored release holds the code or the clear config")
	}
}

// unknownLength is a request body whose length the client does not know,
// so that HTTP/2 leaves the stream open after the headers.
type unknownLength struct{ r io.Reader }

func (u unknownLength) Read(p []byte) (int, error) { return u.r.Read(p) }

// Over HTTP/2 a request may leave its stream open after its headers: it
// must then end it without data.
func TestAnHTTP2RequestLeftOpenMustEndEmpty(t *testing.T) {
	e := newEnv(t, sqliteStore(t, ""), nil, func(_ *install.Config, s *httptest.Server) { s.EnableHTTP2 = true })
	config := e.config(1000)
	code := e.issue(config)
	r := e.send(machine, bearer(code), unknownLength{strings.NewReader("x")})
	if o := e.outcome(); r.status != http.StatusBadRequest || o != install.OutcomeBadRequest {
		t.Fatalf("an open stream with data: %d, %s; want 400", r.status, o)
	}
	r = e.send(machine, bearer(code), unknownLength{strings.NewReader("")})
	if o := e.outcome(); r.status != http.StatusOK || !bytes.Equal(r.body, config) || o != install.OutcomeReleased {
		t.Fatalf("an open stream ended empty: %d, %s; want the config", r.status, o)
	}
}
