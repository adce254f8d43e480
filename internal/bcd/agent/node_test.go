package agent_test

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// journalNamesSerial reports whether a "renewed" journal detail names
// serial. The agent writes it with %x of the number, without the leading
// zero hex.EncodeToString of its bytes has (see the report), so the two are
// compared as numbers.
func journalNamesSerial(detail string, serial *big.Int) bool {
	f := strings.Fields(detail)
	if len(f) < 2 || f[0] != "serial" {
		return false
	}
	n, ok := new(big.Int).SetString(f[1], 16)
	return ok && n.Cmp(serial) == 0
}

func serialOf(st *identity.State) string { return hex.EncodeToString(st.Leaf.SerialNumber.Bytes()) }

// load reads the identity in dir as the agent's next start would.
func load(t *testing.T, dir string) *identity.State {
	t.Helper()
	st, err := identity.LoadState(dir, identity.LoadOptions{KeyLoader: agent.Keys{}.Loader(t.Context())})
	if err != nil {
		t.Fatalf("LoadState: %v", err)
	}
	return st
}

func TestRenewalRotatesTheKey(t *testing.T) {
	cp := startControlPlane(t)
	dir, before := cp.joinNode(t, true)
	w := newWatch()
	renewed := make(chan *identity.State, 1)
	c := cp.nodeConfig(dir, w)
	c.OnRenew = func(st *identity.State) { renewed <- st }
	var steps []string
	c.AfterStore = func(step string) { steps = append(steps, step) }
	r := runNode(t, c)

	e := w.next(t)
	if e.kind != agent.JournalRenewed || e.nodeID != before.Identity.NodeID {
		t.Fatalf("journal %+v, want %s renewed", e, before.Identity.NodeID)
	}
	var st *identity.State
	select {
	case st = <-renewed:
	default:
		t.Fatal("OnRenew was not told the new state before the journal entry")
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("RunNode = %v after its context ended, want nil", err)
	}
	if want := []string{identity.StepNextKey, identity.StepIdentity, identity.StepPromote}; !slices.Equal(steps, want) {
		t.Errorf("storage steps %v, want %v", steps, want)
	}

	onDisk := load(t, dir)
	newSerial := serialOf(onDisk)
	switch {
	case newSerial == serialOf(before):
		t.Fatal("identity.json still holds the joined certificate")
	case serialOf(st) != newSerial:
		t.Errorf("OnRenew got serial %s, identity.json holds %s", serialOf(st), newSerial)
	case !journalNamesSerial(e.detail, onDisk.Leaf.SerialNumber):
		t.Errorf("journal detail %q does not name serial %s", e.detail, newSerial)
	}
	if onDisk.Key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(before.Key.Public()) {
		t.Error("node.key still holds the joined key")
	}
	if _, err := os.Stat(datadir.Layout(dir).NextKey()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node.key.next after the renewal: %v, want it gone", err)
	}
	if onDisk.Identity.Generation != before.Identity.Generation || onDisk.Identity.Site != "fra1" || onDisk.Identity.RenewedAt.IsZero() {
		t.Errorf("renewed identity %+v", onDisk.Identity)
	}
	node, err := cp.db.GetNode(t.Context(), before.Identity.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if node.CertSerial != newSerial {
		t.Errorf("the control plane's current serial is %s, want the renewed %s", node.CertSerial, newSerial)
	}
	if c, err := cp.db.GetCert(t.Context(), newSerial); err != nil || c.Kind != "renew" {
		t.Errorf("renewed certificate recorded as %+v, %v", c, err)
	}
}

// renewOutOfBand renews st's certificate with the unary call, as another
// path of the same node could, and throws the answer away: it only
// counts against the node's renewal limit.
func renewOutOfBand(t *testing.T, cp *controlPlane, st *identity.State) {
	t.Helper()
	cert := &tls.Certificate{Certificate: st.Identity.Chain, PrivateKey: st.Key}
	tc := tlspin.Client(cp.pins.ServingCA, "localhost", func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil })
	conn, err := grpc.NewClient("passthrough:///"+cp.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(csr)
	now := time.Now().UnixNano()
	proof, err := pki.SignRenewProof(st.Key, h[:], now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := joinv1.NewJoinServiceClient(conn).Renew(t.Context(), &joinv1.RenewRequest{Csr: csr, Chain: st.Identity.Chain, ClientTimeUnixNano: now, Proof: proof}); err != nil {
		t.Fatalf("out-of-band renewal: %v", err)
	}
}

// TestPushbackIsWaitedOut: the node renewed a moment ago, so the server
// answers RESOURCE_EXHAUSTED with a pushback until its one-second window
// has passed. The agent's own backoff is an hour, so only the pushback
// can bring the retry within the test.
func TestPushbackIsWaitedOut(t *testing.T) {
	cp := startControlPlane(t, func(c *service.Config) { c.RenewalLimit, c.RenewalWindow = 1, time.Second })
	dir, st := cp.joinNode(t, true)
	renewOutOfBand(t, cp, st)
	w := newWatch()
	c := cp.nodeConfig(dir, w)
	c.BackoffMin, c.BackoffMax = time.Hour, time.Hour
	runNode(t, c)

	var failures []journalEntry
	for {
		e := w.next(t)
		if e.kind == agent.JournalRenewed {
			break
		}
		if e.kind != agent.JournalRenewalFailed || !strings.Contains(e.detail, "ResourceExhausted: node "+st.Identity.NodeID+" renewed 1 times in 1s; retry in") {
			t.Fatalf("journal %+v, want a refusal with pushback", e)
		}
		failures = append(failures, e)
	}
	// The pushback is in whole milliseconds, rounded down (see the
	// report), so a retry exactly on time may come a fraction of a
	// millisecond early once; an agent that ignored the pushback would
	// retry at once, again and again.
	if len(failures) == 0 || len(failures) > 2 {
		t.Fatalf("%d refusals before the renewal, want 1 (2 at most): %+v", len(failures), failures)
	}
	if !strings.Contains(failures[0].detail, "attempt 1:") {
		t.Errorf("first failure %q, want attempt 1", failures[0].detail)
	}
}

// failingJournal is a journal whose every append fails.
type failingJournal struct{ calls chan string }

func (j failingJournal) Append(_ context.Context, kind, _, _ string) error {
	j.calls <- kind
	return errors.New("journal.db is read-only")
}

func TestRevocationOnTheSessionEndsTheAgent(t *testing.T) {
	cases := []struct {
		name          string
		failedJournal bool
	}{
		{name: "the revocation is journaled and ends the agent"},
		{name: "a journal that cannot be written does not keep the agent running", failedJournal: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp := startControlPlane(t)
			dir, st := cp.joinNode(t, false)
			w := newWatch()
			c := cp.nodeConfig(dir, w)
			failed := failingJournal{calls: make(chan string, 8)}
			if tc.failedJournal {
				c.Journal = failed
			}
			r := runNode(t, c)
			w.sessionOpen(t)

			resp, err := cp.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: st.Identity.NodeID, Reason: "disk stolen"})
			if err != nil {
				t.Fatal(err)
			}
			if !resp.SessionNotified {
				t.Error("the control plane found no session to notify")
			}
			if err := r.wait(t); !errors.Is(err, agent.ErrRevoked) {
				t.Fatalf("RunNode = %v, want ErrRevoked", err)
			}
			if tc.failedJournal {
				if kind := <-failed.calls; kind != agent.JournalRevoked || w.logged("journal append failed") != 1 {
					t.Errorf("journal append of %q, %d failures logged; want the revocation tried and its failure logged", kind, w.logged("journal append failed"))
				}
			} else if e := w.next(t); e.kind != agent.JournalRevoked || e.detail != "disk stolen" {
				t.Errorf("journal %+v, want the revocation with its reason", e)
			}
			if w.logged("certificate revoked") != 1 {
				t.Error("the revocation is not logged")
			}
			// Nothing on the node deletes the identity.
			if got := load(t, dir); serialOf(got) != serialOf(st) {
				t.Errorf("identity after revocation holds %s, want the revoked %s kept", serialOf(got), serialOf(st))
			}
		})
	}
}

// TestSecondProcessWithTheSameCertificate opens a session with the node's
// certificate from another process while the agent runs: the agent
// answers the server's probe, so the certificate looks cloned and is
// revoked on both sessions.
func TestSecondProcessWithTheSameCertificate(t *testing.T) {
	cp := startControlPlane(t)
	dir, st := cp.joinNode(t, false)
	w := newWatch()
	r := runNode(t, cp.nodeConfig(dir, w))
	w.sessionOpen(t)

	cert := &tls.Certificate{Certificate: st.Identity.Chain, PrivateKey: st.Key}
	tc := tlspin.Client(cp.pins.ServingCA, "localhost", func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil })
	conn, err := grpc.NewClient("passthrough:///"+cp.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	clone, err := gatewayv1.NewGatewayClient(conn).Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := clone.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "clone"}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := clone.Recv(); err != nil || m.GetRevoked() == nil {
		t.Fatalf("the clone's session got %v, %v; want a revocation", m, err)
	}
	if err := r.wait(t); !errors.Is(err, agent.ErrRevoked) {
		t.Fatalf("RunNode = %v, want ErrRevoked", err)
	}
	if e := w.next(t); e.kind != agent.JournalRevoked || !strings.Contains(e.detail, "certificate looks cloned: two live sessions at once") {
		t.Errorf("journal %+v, want the clone revocation", e)
	}
}

func TestRefusedCertificateEndsTheAgent(t *testing.T) {
	cases := []struct {
		name string
		kill func(t *testing.T, cp *controlPlane, id string)
		msg  string
	}{
		{
			name: "a certificate revoked while the node was away",
			kill: func(t *testing.T, cp *controlPlane, id string) {
				if _, err := cp.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: id, Reason: "away too long"}); err != nil {
					t.Fatal(err)
				}
			},
			msg: "(away too long)",
		},
		{
			name: "the certificate of a node deleted while it was away",
			kill: func(t *testing.T, cp *controlPlane, id string) {
				if _, err := cp.admin.DeleteNode(t.Context(), &adminv1.DeleteNodeRequest{Id: id}); err != nil {
					t.Fatal(err)
				}
			},
			msg: "(node deleted)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp := startControlPlane(t)
			dir, st := cp.joinNode(t, true)
			tc.kill(t, cp, st.Identity.NodeID)
			w := newWatch()
			err := runNode(t, cp.nodeConfig(dir, w)).wait(t)
			if !errors.Is(err, agent.ErrRefused) || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), "bcd join --reset --yes") {
				t.Fatalf("RunNode = %v, want ErrRefused naming %s and the way back", err, tc.msg)
			}
			// The journal records the refusal (doctor and join read it
			// back), and nothing else: a refused session renews nothing.
			select {
			case e := <-w.journal:
				if e.kind != agent.JournalRefused || !strings.Contains(e.detail, tc.msg) {
					t.Errorf("journal %+v, want one %q entry naming %s", e, agent.JournalRefused, tc.msg)
				}
			default:
				t.Errorf("no %q journal entry", agent.JournalRefused)
			}
			select {
			case e := <-w.journal:
				t.Errorf("journal %+v after the refusal: a refused session renews nothing", e)
			default:
			}
		})
	}
}

// TestRenewalFailuresBackOff fails one renewal in several ways; the agent
// logs it, journals it, backs off and renews at the next attempt, with
// its key untouched in between.
func TestRenewalFailuresBackOff(t *testing.T) {
	cases := []struct {
		name string
		arm  func(cp *controlPlane)
		want string
	}{
		{
			name: "the control plane's store fails to record the renewal",
			arm:  func(cp *controlPlane) { cp.store.FailNext("RecordRenewalLimited", storefault.ErrInjected) },
			want: "Unavailable: renewal could not be recorded; retry",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp := startControlPlane(t)
			dir, st := cp.joinNode(t, true)
			tc.arm(cp)
			w := newWatch()
			runNode(t, cp.nodeConfig(dir, w))
			e := w.next(t)
			if e.kind != agent.JournalRenewalFailed || !strings.Contains(e.detail, "attempt 1: "+tc.want) {
				t.Fatalf("journal %+v, want attempt 1 failed with %q", e, tc.want)
			}
			if e := w.next(t); e.kind != agent.JournalRenewed {
				t.Fatalf("journal %+v, want the retry to renew", e)
			}
			if u := cp.store.Unfired(); len(u) > 0 {
				t.Fatalf("store faults never reached: %v", u)
			}
			if w.logged("renewal failed") != 1 {
				t.Errorf("%d renewal failures logged, want 1", w.logged("renewal failed"))
			}
			if got := load(t, dir); serialOf(got) == serialOf(st) {
				t.Error("identity.json still holds the joined certificate")
			}
		})
	}
}

// TestRenewalAnswersTheAgentRefuses: the agent checks what the control
// plane answers, and keeps its key and certificate when the check fails.
func TestRenewalRefusalsKeepTheIdentity(t *testing.T) {
	cases := []struct {
		name string
		edit func(c *agent.NodeConfig)
		want string
	}{
		{
			name: "an answer signed by another key than join_signing_key_pin names",
			edit: func(c *agent.NodeConfig) {
				other, _ := pki.GenerateKey()
				pin, _ := pki.PinOf(other.Public())
				c.Pins.JoinSigning = pin
			},
			want: "check the renewal",
		},
		{
			// Six minutes: beyond the control plane's five of allowed skew,
			// and short of the certificate's end (ten minutes away), which
			// the agent would otherwise see as an expiry.
			name: "a node clock six minutes ahead of the control plane's",
			edit: func(c *agent.NodeConfig) {
				c.Now = func() time.Time { return time.Now().Add(6 * time.Minute) }
			},
			want: "InvalidArgument: client time is -6m",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp := startControlPlane(t)
			dir, st := cp.joinNode(t, true)
			w := newWatch()
			c := cp.nodeConfig(dir, w)
			c.BackoffMin, c.BackoffMax = time.Hour, time.Hour
			tc.edit(&c)
			r := runNode(t, c)
			e := w.next(t)
			if e.kind != agent.JournalRenewalFailed || !strings.Contains(e.detail, tc.want) {
				t.Fatalf("journal %+v, want a failure naming %q", e, tc.want)
			}
			if err := r.stop(t); err != nil {
				t.Fatalf("RunNode = %v, want nil once stopped", err)
			}
			if got := load(t, dir); serialOf(got) != serialOf(st) {
				t.Errorf("identity.json holds %s, want the joined %s kept", serialOf(got), serialOf(st))
			}
		})
	}
}

func TestSessionReconnectsAfterTheServerRestarts(t *testing.T) {
	cp := startControlPlane(t)
	dir, st := cp.joinNode(t, false)
	w := newWatch()
	r := runNode(t, cp.nodeConfig(dir, w))
	w.sessionOpen(t)

	cp.restart(t)
	w.sessionOpen(t)
	if got := w.logged("session lost, reconnecting"); got < 1 {
		t.Errorf("%d lost sessions logged, want at least 1", got)
	}
	// The new session is the restarted server's: it delivers a
	// revocation.
	resp, err := cp.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: st.Identity.NodeID, Reason: "after restart"})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.SessionNotified {
		t.Fatal("the restarted server holds no session of the node")
	}
	if err := r.wait(t); !errors.Is(err, agent.ErrRevoked) {
		t.Fatalf("RunNode = %v, want ErrRevoked", err)
	}
}

// TestSessionEndPushbackIsWaitedOut: the control plane ends the session
// at its start because its store cannot be reached, asking the node to
// stay away 5 s (the gRPC Session's grpc-retry-pushback-ms trailer, the
// framed session's SessionEnd.retry_pushback_ms); the agent waits that
// long, not its own first backoff of 1 s, before the next session, and
// logs that wait as retry_in. A store failure without a pushback keeps
// the 1 s; near the certificate's end the pushback counts for at most
// half of the time the certificate has left.
func TestSessionEndPushbackIsWaitedOut(t *testing.T) {
	cases := []struct {
		name  string
		fault error
		// left, when set, is how long the node's certificate has left
		// by the node's clock.
		left time.Duration
		want time.Duration
	}{
		{name: "store unreachable", fault: fmt.Errorf("%w: connection refused", store.ErrUnavailable), want: 5 * time.Second},
		{name: "store failed", fault: storefault.ErrInjected, want: time.Second},
		// A pushback takes at most half of what the certificate has left.
		{name: "store unreachable near the certificate's end", fault: fmt.Errorf("%w: connection refused", store.ErrUnavailable), left: 6 * time.Second, want: 3 * time.Second},
	}
	for _, transport := range []string{agent.TransportFramed, agent.TransportGRPC} {
		for _, tc := range cases {
			t.Run(transport+"/"+tc.name, func(t *testing.T) {
				cp := startControlPlane(t)
				dir, st := cp.joinNode(t, false)
				w := newWatch()
				c := cp.nodeConfig(dir, w)
				c.SessionTransport = transport
				if tc.left != 0 {
					c.Now = func() time.Time { return st.Leaf.NotAfter.Add(-tc.left) }
				}
				waits := make(chan time.Duration, 16)
				agent.SetSleep(&c, func(ctx context.Context, d time.Duration) error {
					waits <- d
					return ctx.Err()
				})
				cp.store.FailNext("GetCert", tc.fault)
				runNode(t, c)
				w.sessionOpen(t)
				if u := cp.store.Unfired(); len(u) > 0 {
					t.Fatalf("store faults never reached: %v", u)
				}
				select {
				case got := <-waits:
					if got != tc.want {
						t.Errorf("the agent waited %v before the next session, want %v", got, tc.want)
					}
				default:
					t.Fatal("a session opened without a wait after the lost one")
				}
				if got, want := w.retryIns(), []string{tc.want.String()}; !slices.Equal(got, want) {
					t.Errorf("lost sessions logged retry_in %q, want %q", got, want)
				}
				if got := w.sessionTransports(); !slices.Equal(got, []string{transport}) {
					t.Errorf("sessions over %q, want one over %s", got, transport)
				}
			})
		}
	}
}

func TestRunNodeWithoutAnIdentity(t *testing.T) {
	cp := startControlPlane(t)
	err := agent.RunNode(t.Context(), cp.nodeConfig(t.TempDir(), newWatch()))
	if !errors.Is(err, identity.ErrNotJoined) {
		t.Fatalf("RunNode = %v, want ErrNotJoined", err)
	}
}

func TestRenewTime(t *testing.T) {
	cp := startControlPlane(t)
	_, st := cp.joinNode(t, false)
	leaf := st.Leaf
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	cases := []struct {
		name     string
		fraction float64
		want     time.Time
	}{
		{name: "a fraction of zero means the default 60%", fraction: 0, want: leaf.NotBefore.Add(life * 6 / 10)},
		{name: "a fraction of one means the default 60%", fraction: 1, want: leaf.NotBefore.Add(life * 6 / 10)},
		{name: "a fraction of one half renews halfway", fraction: 0.5, want: leaf.NotBefore.Add(life / 2)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := agent.RenewTime(leaf, tc.fraction); !got.Equal(tc.want) {
				t.Fatalf("RenewTime = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestClockOffset(t *testing.T) {
	cp := startControlPlane(t)
	cp.shift.Store(int64(-2 * time.Minute))
	t.Run("a server two minutes behind gives an offset of two minutes", func(t *testing.T) {
		off, err := agent.ClockOffset(t.Context(), cp.addr, "localhost", cp.pins.ServingCA)
		if err != nil {
			t.Fatal(err)
		}
		// The round trip on loopback is far below the slack.
		if off < 2*time.Minute-5*time.Second || off > 2*time.Minute+5*time.Second {
			t.Fatalf("offset %s, want about 2m", off)
		}
	})
	t.Run("a server that is not the pinned one is refused", func(t *testing.T) {
		_, err := agent.ClockOffset(t.Context(), cp.addr, "localhost", cp.pins.JoinSigning)
		if err == nil || !strings.Contains(err.Error(), "is not the one the pins name") {
			t.Fatalf("ClockOffset = %v, want a pin mismatch", err)
		}
	})
}

// TestRenewalsThatFailBeforeAnythingIsSent covers the renewals the agent
// gives up on by itself: it journals each failure, keeps trying with
// backoff, and the control plane sees no request.
func TestRenewalsThatFailBeforeAnythingIsSent(t *testing.T) {
	cases := []struct {
		name string
		// prepare changes the joined node's identity in dir and returns
		// the state the agent starts from.
		prepare func(t *testing.T, cp *controlPlane, dir string, st *identity.State) *identity.State
		want    string
	}{
		{
			name: "a certificate that names a TPM AK does not renew without the TPM (no downgrade)",
			prepare: func(t *testing.T, cp *controlPlane, dir string, st *identity.State) *identity.State {
				// The control plane issues and records a certificate naming
				// an AK for the node's key, as after a certified tpm join.
				name := append([]byte{0x00, 0x0b}, make([]byte, 32)...)
				leaf, err := cp.auth.Issuer.Issue(pki.LeafRequest{
					PublicKey: st.Key.Public(), NodeID: st.Identity.NodeID, Role: st.Identity.Role, Site: st.Identity.Site,
					TPMAKName: name, NotBefore: st.Leaf.NotBefore, NotAfter: st.Leaf.NotAfter,
				})
				if err != nil {
					t.Fatal(err)
				}
				serial := hex.EncodeToString(leaf.SerialNumber.Bytes())
				if err := cp.db.RecordRenewal(t.Context(), store.Cert{Serial: serial, NodeID: st.Identity.NodeID, Generation: st.Identity.Generation,
					Kind: "renew", IssuedAt: time.Now(), NotAfter: leaf.NotAfter}, nil); err != nil {
					t.Fatal(err)
				}
				id := st.Identity
				id.Chain = append([][]byte{leaf.Raw}, id.Chain[1:]...)
				keyPEM, err := os.ReadFile(datadir.Layout(dir).Key())
				if err != nil {
					t.Fatal(err)
				}
				if err := identity.StoreRenewal(dir, id, keyPEM, nil); err != nil {
					t.Fatal(err)
				}
				return load(t, dir)
			},
			want: "the certificate names a TPM AK, and no TPM is open",
		},
		{
			name: "a next key that cannot be stored",
			prepare: func(t *testing.T, cp *controlPlane, dir string, st *identity.State) *identity.State {
				// node.key.next is a directory that is not empty: no file
				// can take its name. The agent takes over st as loaded, so
				// LoadState does not clear it first.
				if err := os.MkdirAll(filepath.Join(datadir.Layout(dir).NextKey(), "in-the-way"), 0o700); err != nil {
					t.Fatal(err)
				}
				return st
			},
			want: "store the next key",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp := startControlPlane(t)
			dir, st := cp.joinNode(t, true)
			w := newWatch()
			c := cp.nodeConfig(dir, w)
			c.State = tc.prepare(t, cp, dir, st)
			r := runNode(t, c)
			for attempt := 1; attempt <= 2; attempt++ {
				e := w.next(t)
				if e.kind != agent.JournalRenewalFailed || !strings.Contains(e.detail, fmt.Sprintf("attempt %d: %s", attempt, tc.want)) {
					t.Fatalf("journal %+v, want attempt %d failed with %q", e, attempt, tc.want)
				}
			}
			if err := r.stop(t); err != nil {
				t.Fatalf("RunNode = %v once stopped, want nil", err)
			}
			if n := cp.store.Calls("RecordRenewalLimited"); n != 0 {
				t.Errorf("the control plane checked %d renewals, want none sent", n)
			}
		})
	}
}
