package agent_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// The agent's tests run it against the real control plane: the handlers of
// package service on a PKI from pki.Init and a SQLite store in
// t.TempDir() (behind a storefault wrapper), served over TLS on
// 127.0.0.1. Progress is read from the agent's journal, its log and the
// identity files, never from sleeps.

const trustDomain = "agent.nodetrust.test"

// controlPlane is a running fleetd.
type controlPlane struct {
	auth  *pki.Authority
	pins  config.Pins
	jwk   []byte
	db    store.Store // the real store
	store *storefault.Store
	cfg   service.Config
	// shift is added to the real time to make the server's clock.
	shift atomic.Int64
	addr  string
	admin adminv1.AdminClient
	// srv is the Server start made last.
	srv *service.Server

	mu   sync.Mutex
	stop func()
}

// startControlPlane starts a control plane whose node certificates live
// an hour, so that one issued with the clock shifted back (see joinNode)
// is due for renewal at once while a renewed one is not.
func startControlPlane(t *testing.T, tweak ...func(*service.Config)) *controlPlane {
	t.Helper()
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	// The CAs start two hours back: the issuer clamps a certificate into
	// its CA's validity, and joinNode issues with the clock shifted back.
	b, err := pki.Init(pkiDir, pki.InitOptions{TrustDomain: trustDomain, Now: time.Now().Add(-2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := pki.LoadAuthority(pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	jwk, err := auth.JoinEncryption.Public().MarshalJWK()
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "fleetd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cp := &controlPlane{
		auth: auth, jwk: jwk, db: db, store: storefault.New(db),
		pins: config.Pins{ServingCA: b.ServingCASPKIPin, JoinSigning: b.JoinSigningKeyPin, JoinEncryption: b.JoinEncryptionKeyPin},
	}
	cp.cfg = service.Config{
		Authority:        auth,
		Store:            cp.store,
		NodeCertLifetime: time.Hour,
		Now:              cp.now,
	}
	for _, f := range tweak {
		f(&cp.cfg)
	}
	cp.start(t)
	owner, err := tls.LoadX509KeyPair(pki.Path(pkiDir, pki.OwnerCertFile), pki.Path(pkiDir, pki.OwnerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	tc := tlspin.Client(cp.pins.ServingCA, "localhost", func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &owner, nil })
	conn, err := grpc.NewClient("passthrough:///"+cp.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cp.admin = adminv1.NewAdminClient(conn)
	return cp
}

func (cp *controlPlane) now() time.Time { return time.Now().Add(time.Duration(cp.shift.Load())) }

// start serves a new Server on cp's address (a new one the first time).
func (cp *controlPlane) start(t *testing.T) {
	t.Helper()
	srv, err := service.New(cp.cfg)
	if err != nil {
		t.Fatal(err)
	}
	cp.srv = srv
	addr := cp.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cp.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	cp.mu.Lock()
	cp.stop = stop
	cp.mu.Unlock()
	t.Cleanup(stop)
}

// restart stops the server and serves a new one on the same address,
// with the same PKI and store.
func (cp *controlPlane) restart(t *testing.T) {
	t.Helper()
	cp.mu.Lock()
	stop := cp.stop
	cp.mu.Unlock()
	stop()
	cp.start(t)
}

var hostSeq atomic.Int32

// joinNode joins a new machine into a fresh data directory with agent.Join
// and returns the directory and the loaded identity. When due is set, the
// certificate is issued with the server's clock 50 minutes back, so the
// agent's renewal time (60% into the hour) has passed when it starts.
func (cp *controlPlane) joinNode(t *testing.T, due bool) (string, *identity.State) {
	t.Helper()
	resp, err := cp.admin.CreateToken(t.Context(), &adminv1.CreateTokenRequest{Role: "worker", Site: "fra1"})
	if err != nil {
		t.Fatal(err)
	}
	if due {
		cp.shift.Store(int64(-50 * time.Minute))
		defer cp.shift.Store(0)
	}
	n := hostSeq.Add(1)
	dir := t.TempDir()
	res, err := agent.Join(t.Context(), agent.JoinConfig{
		Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, JWK: cp.jwk, DataDir: dir,
		Token:  func() ([]byte, error) { return []byte(resp.Token), nil },
		Claims: hwclaims.Claims{ProductUUID: fmt.Sprintf("00000000-0000-4000-8000-%012d", n), Hostname: fmt.Sprintf("node-%d", n)},
	})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if due && !agent.RenewTime(res.State.Leaf, 0).Before(time.Now()) {
		t.Fatalf("the joined certificate is due at %s, not yet", agent.RenewTime(res.State.Leaf, 0))
	}
	return dir, res.State
}

// journalEntry is one entry the agent wrote to its journal.
type journalEntry struct{ kind, nodeID, detail string }

// watch follows a running agent: its journal entries, and its log.
type watch struct {
	journal chan journalEntry
	opened  chan struct{} // one per "session open" logged

	mu         sync.Mutex
	msgs       []string
	transports []string // each opened session's, in order
	retryIn    []string // each "session lost, reconnecting"'s retry_in
}

func newWatch() *watch {
	return &watch{journal: make(chan journalEntry, 256), opened: make(chan struct{}, 256)}
}

// Append implements agent.Journal.
func (w *watch) Append(_ context.Context, kind, nodeID, detail string) error {
	w.journal <- journalEntry{kind, nodeID, detail}
	return nil
}

func (w *watch) Enabled(context.Context, slog.Level) bool { return true }

func (w *watch) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	w.msgs = append(w.msgs, r.Message)
	if r.Message == "session open" {
		tr := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "transport" {
				tr = a.Value.String()
			}
			return true
		})
		w.transports = append(w.transports, tr)
	}
	if r.Message == "session lost, reconnecting" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "retry_in" {
				w.retryIn = append(w.retryIn, a.Value.String())
			}
			return true
		})
	}
	w.mu.Unlock()
	if r.Message == "session open" {
		w.opened <- struct{}{}
	}
	return nil
}

func (w *watch) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *watch) WithGroup(string) slog.Handler      { return w }

// sessionTransports returns the transport of each session opened so far.
func (w *watch) sessionTransports() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.transports)
}

// retryIns returns the retry_in of each lost session logged so far.
func (w *watch) retryIns() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.retryIn)
}

// logged reports how many times msg was logged.
func (w *watch) logged(msg string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// waitLimit bounds every wait for the agent, so that a broken agent fails
// the test instead of hanging it. Nothing waits for it to pass.
const waitLimit = 30 * time.Second

// next returns the agent's next journal entry.
func (w *watch) next(t *testing.T) journalEntry {
	t.Helper()
	select {
	case e := <-w.journal:
		return e
	case <-time.After(waitLimit):
		t.Fatal("no journal entry from the agent")
	}
	return journalEntry{}
}

// sessionOpen waits until the agent opened a session.
func (w *watch) sessionOpen(t *testing.T) {
	t.Helper()
	select {
	case <-w.opened:
	case <-time.After(waitLimit):
		t.Fatal("the agent opened no session")
	}
}

// running is an agent.RunNode in its own goroutine.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// runNode starts agent.RunNode; the test's end stops it.
func runNode(t *testing.T, c agent.NodeConfig) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = agent.RunNode(ctx, c)
		close(r.done)
	}()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// wait returns RunNode's result once it returned.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(waitLimit):
		t.Fatal("RunNode did not return")
	}
	return nil
}

// stop ends RunNode as a signal does and returns its result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

// nodeConfig is the agent's configuration for the identity in dir.
func (cp *controlPlane) nodeConfig(dir string, w *watch) agent.NodeConfig {
	return agent.NodeConfig{
		Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, DataDir: dir, Version: "test",
		Logger: slog.New(w), Journal: w,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
	}
}
