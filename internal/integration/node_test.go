package integration

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/pki"
)

func TestNodeRenewsWithANewKeyEachTime(t *testing.T) {
	cp := startControlPlane(t, "node_cert_lifetime = \"3s\"\n")
	m := newMachine(t, cp, "", "")
	node := m.join(t, cp)
	first, err := identity.LoadState(m.dataDir, identity.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	verifySVID(t, first) // a token join's certificate
	joinKey, _ := pki.PinOf(first.Key.Public())

	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)
	serials := map[string]bool{pki.SerialHex(first.Leaf): true}
	keys := map[string]bool{joinKey.String(): true}
	for i := 0; i < 3; i++ {
		got := a.waitFor(t, renewedRE, 30*time.Second)
		if serials[got[1]] || keys[got[2]] {
			t.Fatalf("renewal %d reused a serial or key: serial %s key %s", i+1, got[1], got[2])
		}
		serials[got[1]], keys[got[2]] = true, true
	}
	// Stop the agent, then take every renewal it logged, including any
	// after the three awaited.
	_ = a.cmd.Process.Signal(os.Interrupt)
	a.wait(t, 30*time.Second)
	for _, m := range renewedRE.FindAllStringSubmatch(a.log.String(), -1) {
		serials[m[1]], keys[m[2]] = true, true
	}
	st := run(t, "", nil, "bcd", "status", "--config", m.cfg, "--json")
	if st.code != 0 || !strings.Contains(st.stdout, `"kind": "renewed"`) {
		t.Fatalf("bcd status after renewals: %s", st)
	}
	now, err := identity.LoadState(m.dataDir, identity.LoadOptions{})
	if err != nil {
		t.Fatalf("the stored identity does not load after renewals: %v", err)
	}
	verifySVID(t, now) // a renewal's certificate
	pin, _ := pki.PinOf(now.Key.Public())
	if !keys[pin.String()] || pin == joinKey {
		t.Errorf("the stored key %s is not one the renewals certified", pin)
	}
	if !serials[pki.SerialHex(now.Leaf)] || now.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
		t.Errorf("the stored certificate %x is not one the renewals returned", now.Leaf.SerialNumber)
	}
	if show := run(t, "", nil, "fleetd", "nodes", "show", node, "--config", cp.config, "--json"); jsonField(show.stdout, "state") != "active" {
		t.Errorf("the node is not active after its renewals: %s", show.stdout)
	}
}

// jsonField pulls a string field out of indented JSON output.
func jsonField(out, field string) string {
	m := regexp.MustCompile(`"` + field + `": "([^"]*)"`).FindStringSubmatch(out)
	if m == nil {
		return ""
	}
	return m[1]
}

func TestRenewalSurvivesACrashAtEveryStorageStep(t *testing.T) {
	cp := startControlPlane(t, "node_cert_lifetime = \"3s\"\n")
	for _, step := range []string{identity.StepNextKey, identity.StepIdentity, identity.StepPromote} {
		t.Run("killed after "+step, func(t *testing.T) {
			m := newMachine(t, cp, "", "")
			m.join(t, cp)
			a := startAgent(t, m, "NODETRUST_DEBUG_CRASH_AFTER="+step)
			if code := a.wait(t, 60*time.Second); code != -1 {
				t.Fatalf("bcd node exited %d, want killed by SIGKILL:\n%s", code, a.log)
			}
			st, err := identity.LoadState(m.dataDir, identity.LoadOptions{})
			if err != nil {
				t.Fatalf("after a crash at %s the identity does not load: %v", step, err)
			}
			if !st.Leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(st.Key.Public()) {
				t.Fatalf("after a crash at %s the key does not match the certificate", step)
			}
			if _, err := os.Stat(filepath.Join(m.dataDir, datadir.NextKeyFile)); !os.IsNotExist(err) {
				t.Errorf("node.key.next is still there after LoadState: %v", err)
			}
			// The node goes on: it renews again.
			b := startAgent(t, m)
			b.waitFor(t, renewedRE, 30*time.Second)
		})
	}
}

func TestRevocationEndsTheNodeAndItComesBackOnlyByJoiningAgain(t *testing.T) {
	cp := startControlPlane(t, "")
	m := newMachine(t, cp, "6a1f5c1e-0000-4000-8000-000000000001", "")
	node := m.join(t, cp)
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)
	old, err := identity.LoadState(m.dataDir, identity.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}

	r := run(t, "", nil, "fleetd", "nodes", "revoke", node, "--reason", "disk stolen", "--config", cp.config)
	if r.code != 0 || !strings.Contains(r.stdout, "live session notified: true") {
		t.Fatalf("nodes revoke: %s", r)
	}
	if code := a.wait(t, 30*time.Second); code != 1 {
		t.Errorf("bcd node exited %d, want 1", code)
	}
	log := a.log.String()
	if !strings.Contains(log, "agent: this node's certificate was revoked\n") {
		t.Errorf("bcd node did not print the revocation line:\n%s", log)
	}
	if !strings.Contains(log, `msg="certificate revoked"`) || !strings.Contains(log, `reason="disk stolen"`) {
		t.Errorf("bcd node did not log the revocation with its reason:\n%s", log)
	}
	if _, err := identity.LoadState(m.dataDir, identity.LoadOptions{}); err != nil {
		t.Errorf("the node removed or broke its identity after the revocation: %v", err)
	}

	t.Run("the old certificate cannot renew", func(t *testing.T) {
		code := renewWith(t, cp, old)
		if code != codes.Unauthenticated {
			t.Errorf("renew with a revoked certificate: %s, want Unauthenticated", code)
		}
	})
	t.Run("the old certificate cannot open a session", func(t *testing.T) {
		b := startAgent(t, m)
		if code := b.wait(t, 30*time.Second); code != 1 || !strings.Contains(b.log.String(), "refuses this node's certificate") {
			t.Errorf("bcd node with a revoked certificate: exit %d\n%s", code, b.log)
		}
	})
	wayBack := "join again: bcd join --reset --yes < token.txt, with a fresh token"
	t.Run("join and doctor say it is revoked and give the way back", func(t *testing.T) {
		checkDeadIdentity(t, m, "this machine is joined as "+node+", but the control plane",
			`the control plane (revoked|refused) the certificate of node `+regexp.QuoteMeta(node), wayBack)
	})
	t.Run("status shows the revocation with the way back", func(t *testing.T) {
		r := run(t, "", nil, "bcd", "status", "--config", m.cfg)
		if r.code != 0 || !strings.Contains(r.stdout, "REVOKED:") || !strings.Contains(r.stdout, wayBack) {
			t.Errorf("status of a revoked node: %s", r)
		}
	})
	t.Run("reset without --yes moves nothing and exits 2", func(t *testing.T) {
		r := run(t, "", m.env(), "bcd", "join", "--config", m.cfg, "--reset")
		if r.code != 2 || !strings.Contains(r.stdout, filepath.Join(m.dataDir, "identity.json")) {
			t.Errorf("dry run: %s", r)
		}
		if _, err := os.Stat(filepath.Join(m.dataDir, "identity.json")); err != nil {
			t.Errorf("the dry run moved identity.json: %v", err)
		}
	})
	t.Run("the dry run needs only --data-dir", func(t *testing.T) {
		// No config, no pins: a broken machine can still be looked at.
		r := run(t, "", nil, "bcd", "join", "--config", filepath.Join(t.TempDir(), "absent.toml"), "--data-dir", m.dataDir, "--reset")
		if r.code != 2 || !strings.Contains(r.stdout, filepath.Join(m.dataDir, "identity.json")) || !strings.Contains(r.stdout, filepath.Join(m.dataDir, "node.key")) {
			t.Errorf("dry run with --data-dir alone: %s", r)
		}
		if _, err := os.Stat(filepath.Join(m.dataDir, "identity.json")); err != nil {
			t.Errorf("the dry run moved identity.json: %v", err)
		}
	})
	t.Run("a token without allow-reclaim does not bring it back", func(t *testing.T) {
		tok := cp.token(t, "--role", "worker")
		assertRefused(t, run(t, tok, m.env(), "bcd", "join", "--config", m.cfg, "--reset", "--yes"))
	})
	t.Run("reset and a reclaim token bring it back as the same node", func(t *testing.T) {
		tok := cp.token(t, "--role", "worker", "--allow-reclaim")
		r := run(t, tok, m.env(), "bcd", "join", "--config", m.cfg, "--reset", "--yes")
		mm := joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout)))
		if r.code != 0 || mm == nil || mm[1] != node {
			t.Fatalf("reset and rejoin: %s", r)
		}
		b := startAgent(t, m)
		b.waitFor(t, sessionOpenRE, 30*time.Second)
	})
}

// checkDeadIdentity checks that bcd join on m's dead identity fails, saying
// joinSays and the way back, instead of "already joined", and that bcd
// doctor fails the identity check with a message matching doctorRE and the
// way back as its fix.
func checkDeadIdentity(t *testing.T, m *machine, joinSays, doctorRE, wayBack string) {
	t.Helper()
	r := run(t, "", m.env(), "bcd", "join", "--config", m.cfg)
	if r.code != 1 || strings.Contains(r.stdout, "already joined") || !strings.Contains(r.stderr, joinSays) || !strings.Contains(r.stderr, wayBack) {
		t.Errorf("join on a dead identity: %s", r)
	}
	fix := strings.TrimPrefix(wayBack, "join again: ")
	d := run(t, "", nil, "bcd", "doctor", "--config", m.cfg)
	if d.code != 1 || !regexp.MustCompile(`fail +identity +`+doctorRE).MatchString(d.stdout) || !strings.Contains(d.stdout, "→ "+fix) {
		t.Errorf("doctor on a dead identity: %s", d)
	}
}

// movedLines returns the "moved aside" lines --reset --yes prints first.
func movedLines(out string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(out, "\n") {
		if !strings.HasPrefix(l, "moved aside: ") {
			break
		}
		b.WriteString(l)
	}
	return b.String()
}

// renewWith calls JoinService.Renew with the identity st and returns the
// answer's code.
func renewWith(t *testing.T, cp *controlPlane, st *identity.State) codes.Code {
	t.Helper()
	pins := parsePins(t, cp)
	cert := tlsCert(st)
	conn, _, _, err := agent.Dial([]string{cp.addr}, "fleetd.test", pins.ServingCA, func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	key, _ := pki.GenerateKey()
	csr, _ := pki.CreateCSR(key)
	h := sha256.Sum256(csr)
	now := time.Now().UnixNano()
	proof, _ := pki.SignRenewProof(st.Key, h[:], now)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = joinv1.NewJoinServiceClient(conn).Renew(ctx, &joinv1.RenewRequest{Csr: csr, Chain: st.Identity.Chain, ClientTimeUnixNano: now, Proof: proof})
	return status.Code(err)
}

func tlsCert(st *identity.State) *tls.Certificate {
	var chain [][]byte
	for _, c := range st.Chain {
		chain = append(chain, c.Raw)
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: st.Key, Leaf: st.Leaf}
}

type testPins struct{ ServingCA pki.Pin }

func parsePins(t *testing.T, cp *controlPlane) testPins {
	t.Helper()
	p, err := pki.ParsePin(cp.bundle.ServingCASPKIPin)
	if err != nil {
		t.Fatal(err)
	}
	return testPins{ServingCA: p}
}

func TestTheSeventhRenewalInAWindowWaitsOutThePushback(t *testing.T) {
	cp := startControlPlane(t, "node_cert_lifetime = \"10s\"\nrenewal_limit = 6\nrenewal_window = \"9s\"\n")
	m := newMachine(t, cp, "", "[renewal]\nfraction = 0.3\n")
	m.join(t, cp)
	a := startAgent(t, m)
	for i := 0; i < 6; i++ {
		a.waitFor(t, renewedRE, 30*time.Second)
	}
	failed := a.waitFor(t, regexp.MustCompile(`msg="renewal failed" .*retry_in=(\S+) error="ResourceExhausted: ([^"]*)"`), 30*time.Second)
	wait, err := time.ParseDuration(failed[1])
	if err != nil || wait <= 0 || wait > 9*time.Second {
		t.Errorf("the node waits %q after the pushback, want a wait within the 9s window", failed[1])
	}
	if !strings.Contains(failed[2], "renewed 6 times") {
		t.Errorf("the refusal does not say why: %q", failed[2])
	}
	a.waitFor(t, renewedRE, 30*time.Second)
}

func TestASecondSessionWithTheSameCertificateRevokesTheNode(t *testing.T) {
	cp := startControlPlane(t, "")
	m := newMachine(t, cp, "", "")
	node := m.join(t, cp)
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)

	// A copy of the machine's files in another process: a clone.
	clone := newMachine(t, cp, "", "")
	if err := os.MkdirAll(clone.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"identity.json", "node.key"} {
		b, err := os.ReadFile(filepath.Join(m.dataDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(clone.dataDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b := startAgent(t, clone)
	if code := b.wait(t, 30*time.Second); code != 1 {
		t.Errorf("the clone exited %d, want 1:\n%s", code, b.log)
	}
	if code := a.wait(t, 30*time.Second); code != 1 || !strings.Contains(a.log.String(), "looks cloned") {
		t.Errorf("the original exited %d, want 1 with the clone reason:\n%s", code, a.log)
	}
	show := run(t, "", nil, "fleetd", "nodes", "show", node, "--config", cp.config, "--json")
	if jsonField(show.stdout, "state") != "revoked" {
		t.Errorf("node state after a clone: %s", show.stdout)
	}
}

func TestAJoinWaitsForApproval(t *testing.T) {
	cp := startControlPlane(t, "pending_poll = \"1s\"\n")
	m := newMachine(t, cp, "", "")
	tok := cp.token(t, "--role", "worker", "--require-approval")
	j := startJoin(t, m, tok)
	j.waitFor(t, regexp.MustCompile(`^bcd: waiting for the control plane's approval \(node \S+ waits for approval: fleetd nodes approve \S+\); asking again in 1s$`), 30*time.Second)
	node := approvePending(t, cp, m)
	j.waitFor(t, regexp.MustCompile(`^joined as `+regexp.QuoteMeta(node)+` `), 30*time.Second)
	if code := j.wait(t, 30*time.Second); code != 0 {
		t.Errorf("join exited %d:\n%s", code, j.log)
	}
}

// approvePending approves the one join waiting for approval, after checking
// that m has no identity yet, and returns its node id.
func approvePending(t *testing.T, cp *controlPlane, m *machine) string {
	t.Helper()
	pend := run(t, "", nil, "fleetd", "nodes", "pending", "--config", cp.config, "--json")
	node := jsonField(pend.stdout, "node_id")
	if pend.code != 0 || node == "" {
		t.Fatalf("nodes pending: %s", pend)
	}
	if _, err := os.Stat(filepath.Join(m.dataDir, "identity.json")); !os.IsNotExist(err) {
		t.Fatalf("an identity exists before approval: %v", err)
	}
	if r := run(t, "", nil, "fleetd", "nodes", "approve", node, "--config", cp.config); r.code != 0 {
		t.Fatalf("nodes approve: %s", r)
	}
	return node
}

// startJoin runs bcd join in the background with the token on stdin.
func startJoin(t *testing.T, m *machine, tok string) *agentProc {
	t.Helper()
	return startProc(t, strings.NewReader(tok), m.env(), "join", "--config", m.cfg)
}

func TestAStoppingControlPlaneEndsSessionsSoNodesReconnect(t *testing.T) {
	cp := startControlPlane(t, "")
	m := newMachine(t, cp, "", "")
	m.join(t, cp)
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)
	cp.stop(t)
	a.waitFor(t, regexp.MustCompile(`msg="session lost, reconnecting" .*fleetd is shutting down; reconnect`), 30*time.Second)
}
