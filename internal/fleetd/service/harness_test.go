package service_test

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// The tests of this package are black-box: a real Server (a PKI from
// pki.Init, a SQLite store in t.TempDir() behind a storefault wrapper)
// serves gRPC over TLS on 127.0.0.1, and the tests call it as a node and
// an admin do, then read the outcome back from the store and the log.

const trustDomain = "svc.nodetrust.test"

// clock is the server's clock: it stands still until a test moves it. It
// starts at the real time, since TLS checks certificates against that.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// logRecord is one record the server logged, its attributes as text.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// logs records what the server logs.
type logs struct {
	mu   sync.Mutex
	recs []logRecord
}

type logHandler struct {
	l     *logs
	attrs []slog.Attr
}

func (h logHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	h.l.recs = append(h.l.recs, rec)
	return nil
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{l: h.l, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h logHandler) WithGroup(string) slog.Handler { return h }

// find returns the records with message msg whose attribute key contains
// sub.
func (l *logs) find(msg, key, sub string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
	for _, r := range l.recs {
		if r.msg == msg && strings.Contains(r.attrs[key], sub) {
			out = append(out, r)
		}
	}
	return out
}

// env is a running control plane and its clients.
type env struct {
	t      *testing.T
	dir    string
	auth   *pki.Authority
	bundle *pki.Bundle
	db     store.Store // the real store, calls neither counted nor failed
	store  *storefault.Store
	clock  *clock
	logs   *logs
	srv    *service.Server
	addr   string
	stop   func() // stops the server; the test's end calls it too

	join  joinv1.JoinServiceClient // no client certificate
	admin adminv1.AdminClient      // the owner credential

	// grpcSessions makes nodeClients' Gateway open gRPC Sessions; by
	// default they are framed sessions, as bcd opens them.
	grpcSessions bool
}

// newEnv starts a server; tweak adjusts its Config before New.
func newEnv(t *testing.T, tweak ...func(*service.Config)) *env {
	t.Helper()
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	bundle, err := pki.Init(pkiDir, pki.InitOptions{TrustDomain: trustDomain})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := pki.LoadAuthority(pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "fleetd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e := &env{
		t: t, dir: dir, auth: auth, bundle: bundle, db: db, store: storefault.New(db),
		clock: &clock{t: time.Now().UTC().Truncate(time.Second)}, logs: &logs{},
	}
	cfg := service.Config{
		Authority: auth,
		Store:     e.store,
		Logger:    slog.New(logHandler{l: e.logs}),
		Now:       e.clock.Now,
	}
	for _, f := range tweak {
		f(&cfg)
	}
	e.srv, err = service.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(ctx, ln) }()
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(e.stop)
	e.join = joinv1.NewJoinServiceClient(e.dial(t, nil))
	owner, err := tls.LoadX509KeyPair(pki.Path(pkiDir, pki.OwnerCertFile), pki.Path(pkiDir, pki.OwnerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	e.admin = adminv1.NewAdminClient(e.dial(t, &owner))
	return e
}

// dial connects to the server over TLS pinned to the serving CA, with
// cert as the client certificate when it is not nil.
func (e *env) dial(t *testing.T, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	var get func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	if cert != nil {
		get = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	tc := tlspin.Client(e.bundle.ServingCASPKIPin, e.bundle.ServerName, get)
	conn, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// token creates a join token through the admin API and returns its
// secret and id.
func (e *env) token(t *testing.T, req *adminv1.CreateTokenRequest) (secret, id string) {
	t.Helper()
	if req == nil {
		req = &adminv1.CreateTokenRequest{Role: "worker"}
	}
	resp, err := e.admin.CreateToken(t.Context(), req)
	if err != nil {
		t.Fatalf("CreateToken: %v", err)
	}
	return resp.Token, resp.Info.Id
}

// machine is a would-be node: its key, its CSR and its hardware claims.
type machine struct {
	key     crypto.Signer
	csr     []byte
	csrHash []byte
	claims  *joinv1.HardwareClaims
}

var machineSeq struct {
	sync.Mutex
	n int
}

// newMachine makes a machine with a fresh key and a product UUID of its
// own, named hostname.
func newMachine(t *testing.T, hostname string) *machine {
	t.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	machineSeq.Lock()
	machineSeq.n++
	n := machineSeq.n
	machineSeq.Unlock()
	h := sha256.Sum256(csr)
	return &machine{key: key, csr: csr, csrHash: h[:], claims: &joinv1.HardwareClaims{
		ProductUuid: fmt.Sprintf("00000000-0000-4000-8000-%012d", n), Hostname: hostname, BootId: "boot-1",
	}}
}

// seal seals secret to the join encryption key for csrHash.
func (e *env) seal(t *testing.T, csrHash []byte, secret string) []byte {
	t.Helper()
	sealed, err := pki.SealToken(e.auth.JoinEncryption.Public(), csrHash, []byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return sealed
}

// request is m's token join with secret.
func (e *env) request(t *testing.T, m *machine, secret string) *joinv1.JoinRequest {
	t.Helper()
	return &joinv1.JoinRequest{
		Csr: m.csr, Attestor: "token", SealedToken: e.seal(t, m.csrHash, secret),
		Claims: m.claims, DaemonVersion: "test",
	}
}

// open checks a signed answer as a node does.
func (e *env) open(t *testing.T, signed *joinv1.SignedJoinResult, csrHash []byte, key crypto.PublicKey) *joinresponse.Opened {
	t.Helper()
	opened, err := joinresponse.Open(signed, joinresponse.Expect{
		SigningKeyPin: e.bundle.JoinSigningKeyPin, CSRSHA256: csrHash, PublicKey: key,
		TrustDomain: trustDomain, Now: e.clock.Now(),
	})
	if err != nil {
		t.Fatalf("open the signed answer: %v", err)
	}
	return opened
}

// node is a joined node: its current key and chain.
type node struct {
	id    string
	gen   uint64
	key   crypto.Signer
	chain [][]byte
	leaf  *joinresponse.Opened
}

func (n *node) serial() string { return hex.EncodeToString(n.leaf.Leaf.SerialNumber.Bytes()) }

// tlsCert is n's certificate for mutual TLS.
func (n *node) tlsCert() *tls.Certificate {
	return &tls.Certificate{Certificate: n.chain, PrivateKey: n.key, Leaf: n.leaf.Leaf}
}

// mustJoin joins m with secret and returns the node.
func (e *env) mustJoin(t *testing.T, m *machine, req *joinv1.JoinRequest) *node {
	t.Helper()
	resp, err := e.join.Join(t.Context(), req)
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	if resp.GetSigned() == nil {
		t.Fatalf("Join answered %T, want a signed result", resp.Result)
	}
	o := e.open(t, resp.GetSigned(), m.csrHash, m.key.Public())
	return &node{id: o.Result.NodeId, gen: o.Result.IdentityGeneration, key: m.key, chain: o.Result.Chain, leaf: o}
}

// newNode joins a new machine with a new worker token.
func (e *env) newNode(t *testing.T, hostname string) *node {
	t.Helper()
	secret, _ := e.token(t, nil)
	m := newMachine(t, hostname)
	return e.mustJoin(t, m, e.request(t, m, secret))
}

// nodeClients dials as n (mutual TLS with its certificate).
func (e *env) nodeClients(t *testing.T, n *node) (joinv1.JoinServiceClient, gatewayv1.GatewayClient) {
	t.Helper()
	conn := e.dial(t, n.tlsCert())
	if e.grpcSessions {
		return joinv1.NewJoinServiceClient(conn), gatewayv1.NewGatewayClient(conn)
	}
	return joinv1.NewJoinServiceClient(conn), e.framedGateway(n.tlsCert())
}

// wantStatus checks err's code and that its message contains sub.
func wantStatus(t *testing.T, err error, code codes.Code, sub string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code || !strings.Contains(st.Message(), sub) {
		t.Fatalf("error = %v, want %s containing %q", err, code, sub)
	}
}

// metric returns the /metrics lines that start with prefix.
func (e *env) metric(t *testing.T, prefix string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	e.srv.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	var out []string
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// audit returns the audit events with action, newest first.
func (e *env) audit(t *testing.T, action string) []store.AuditEvent {
	t.Helper()
	all, err := e.db.ListAudit(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []store.AuditEvent
	for _, a := range all {
		if a.Action == action {
			out = append(out, a)
		}
	}
	return out
}

// nodes returns the ids of the stored nodes.
func (e *env) nodes(t *testing.T) []string {
	t.Helper()
	ns, err := e.db.ListNodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, n := range ns {
		ids = append(ids, n.ID)
	}
	return ids
}

// storedNode reads a node back from the store.
func (e *env) storedNode(t *testing.T, id string) store.Node {
	t.Helper()
	n, err := e.db.GetNode(context.Background(), id)
	if err != nil {
		t.Fatalf("GetNode(%s): %v", id, err)
	}
	return n
}

// storedToken reads a token back from the store by its secret.
func (e *env) storedToken(t *testing.T, secret string) store.Token {
	t.Helper()
	h := sha256.Sum256([]byte(secret))
	tok, err := e.db.TokenByHash(context.Background(), h[:])
	if err != nil {
		t.Fatalf("TokenByHash: %v", err)
	}
	return tok
}

// storedCert reads a certificate record back from the store.
func (e *env) storedCert(t *testing.T, serial string) store.Cert {
	t.Helper()
	c, err := e.db.GetCert(context.Background(), serial)
	if err != nil {
		t.Fatalf("GetCert(%s): %v", serial, err)
	}
	return c
}

// wantFired fails when an armed store fault was never reached: the test
// then did not exercise what it claims.
func (e *env) wantFired(t *testing.T) {
	t.Helper()
	if u := e.store.Unfired(); len(u) > 0 {
		t.Fatalf("store faults never reached: %v", u)
	}
}
