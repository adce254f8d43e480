package localserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/localapi"
	"github.com/nodetrust/nodetrust/pki"
)

// clock is a settable clock for daemons and signers.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().Round(0)} }

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

// fleet is a CA that issues node certificates of one trust domain.
type fleet struct {
	td     string
	issuer *pki.Issuer
	root   *x509.Certificate
}

func newFleet(t *testing.T, td string) *fleet {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: td + " root"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := pki.NewIssuer(root, key, nil, td)
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{td: td, issuer: iss, root: root}
}

// state issues a node certificate for node and returns it as a loaded
// identity; noRoots leaves out the trust bundle.
func (f *fleet) state(t *testing.T, node string, noRoots bool) *identity.State {
	t.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := f.issuer.Issue(pki.LeafRequest{PublicKey: key.Public(), NodeID: node, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	st := &identity.State{
		Identity: identity.Identity{NodeID: node, TrustDomain: f.td, Chain: [][]byte{leaf.Raw}},
		Leaf:     leaf, Chain: []*x509.Certificate{leaf}, Key: key,
	}
	if !noRoots {
		st.Identity.Roots = [][]byte{f.root.Raw}
		st.Roots = []*x509.Certificate{f.root}
	}
	return st
}

// testDaemon is a daemon serving its local API on a unix socket and its
// federation service on loopback.
type testDaemon struct {
	*Server
	dataDir string
	fedAddr string
	clock   *clock
	ended   chan string
}

// shortDir returns a temporary directory with a short path, for sockets.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "ntd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func startDaemon(t *testing.T, st *identity.State, edit func(*Config)) *testDaemon {
	t.Helper()
	clk := newClock()
	d := &testDaemon{dataDir: shortDir(t), clock: clk, ended: make(chan string, 16)}
	cfg := Config{State: st, DataDir: d.dataDir, Resources: []string{"gpu0", "gpu1"}, Now: clk.Now}
	if edit != nil {
		edit(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.onEnd = func(name string) { d.ended <- name }
	d.Server = s
	l, err := listenSocket(s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	go s.ServeLocal(l)
	if st != nil && len(st.Roots) > 0 {
		fl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		d.fedAddr = fl.Addr().String()
		go s.ServeFederation(fl)
	}
	t.Cleanup(s.Close)
	return d
}

// signer returns a signer for sender with key on the daemon's clock,
// shifted by skew.
func (d *testDaemon) signer(t *testing.T, sender string, key ed25519.PrivateKey, skew time.Duration) *callsig.Signer {
	t.Helper()
	s, err := callsig.NewSigner(callsig.SignerConfig{Sender: sender, Key: key, Now: func() time.Time { return d.clock.Now().Add(skew) }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// cliKey reads the command line's key the daemon made.
func (d *testDaemon) cliKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	k, err := localapi.ReadKeyFile(filepath.Join(d.dataDir, datadir.CredentialsDir, datadir.CLIKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// client dials the daemon's socket as signer.
func (d *testDaemon) client(t *testing.T, signer *callsig.Signer) *localapi.Client {
	t.Helper()
	c, err := localapi.Dial(context.Background(), d.Socket(), signer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cli is a client signing as the command line.
func (d *testDaemon) cli(t *testing.T) *localapi.Client {
	return d.client(t, d.signer(t, localapi.CLISender, d.cliKey(t), 0))
}

// startedInstance is a start held open on the Run stream.
type startedInstance struct {
	stream  localv1.LocalAPI_RunClient
	cancel  context.CancelFunc
	started *localv1.Started
	key     ed25519.PrivateKey
	rt      *localapi.Runtime
}

// startInstance starts instance name as the command line would (bcd run).
func (d *testDaemon) startInstance(t *testing.T, name string) *startedInstance {
	t.Helper()
	cli := d.cli(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	env, err := cli.Envelope(localapi.Call{Service: localapi.ServiceInstances, Method: localapi.MethodStart, Request: localapi.StartRequest{Name: name}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := env.MarshalBinary()
	stream, err := cli.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&localv1.RunRequest{Body: &localv1.RunRequest_Start{Start: b}}); err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	st := m.GetStarted()
	if st == nil {
		t.Fatalf("start of %s refused: %v", name, m.GetRefused())
	}
	rt, err := localapi.ReadRuntime(st.GetRuntimeFile())
	if err != nil {
		t.Fatal(err)
	}
	key, err := localapi.ReadKeyFile(rt.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &startedInstance{stream: stream, cancel: cancel, started: st, key: key, rt: rt}
}

// exit ends the start as bcd run does when the program exits, and waits
// for the daemon's confirmation.
func (in *startedInstance) exit(t *testing.T) {
	t.Helper()
	if err := in.stream.Send(&localv1.RunRequest{Body: &localv1.RunRequest_Exited{Exited: &localv1.Exited{Code: 0}}}); err != nil {
		t.Fatal(err)
	}
	m, err := in.stream.Recv()
	if err != nil || m.GetEnded() == nil {
		t.Fatalf("no end after exited: %v %v", m, err)
	}
}

// send signs call with c and returns the daemon's reply.
func send(t *testing.T, c *localapi.Client, call localapi.Call) *localv1.CallReply {
	t.Helper()
	env, err := c.Envelope(call)
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Send(context.Background(), &localv1.CallRequest{Envelope: b, Address: call.Address})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wantRejected checks that r is a refusal whose message starts with check
// and holds each of parts.
func wantRejected(t *testing.T, r *localv1.CallReply, check string, parts ...string) {
	t.Helper()
	if r.GetKind() != localapi.KindRejected || !strings.HasPrefix(r.GetMessage(), check+": ") {
		t.Fatalf("reply %q %q, want rejected with check %q", r.GetKind(), r.GetMessage(), check)
	}
	for _, p := range parts {
		if !strings.Contains(r.GetMessage(), p) {
			t.Errorf("refusal %q does not say %q", r.GetMessage(), p)
		}
	}
}

func wantOK(t *testing.T, r *localv1.CallReply) {
	t.Helper()
	if r.GetKind() != localapi.KindOK {
		t.Fatalf("reply %q %q, want ok", r.GetKind(), r.GetMessage())
	}
}

// insecureTLS trusts any server: tests that send forged proofs check the
// receiver's refusal, not its certificate.
func insecureTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} //nolint:gosec // test client
}
