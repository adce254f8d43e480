package integration

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/postgres/pgtest"
	"github.com/nodetrust/nodetrust/pki"
)

// fleet is several fleetd replicas on one PostgreSQL database, sharing one
// PKI, each on its own loopback port.
type fleet struct {
	pg       *pgtest.Cluster
	replicas []*controlPlane
}

// startReplicas runs fleetd init once and n replicas of fleetd serve on
// one new database of pg, each naming all of them in advertise_addresses.
func startReplicas(t *testing.T, pg *pgtest.Cluster, n int, extra string) *fleet {
	t.Helper()
	base := t.TempDir()
	pkiDir := filepath.Join(base, "pki")
	if r := run(t, "", nil, "fleetd", "init", "--dir", pkiDir, "--trust-domain", "test.nodetrust.example", "--server-name", "fleetd.test"); r.code != 0 {
		t.Fatalf("fleetd init: %s", r)
	}
	dsn := pg.NewDatabase(t)
	var addrs []string
	for range n {
		addrs = append(addrs, freeAddr(t))
	}
	f := &fleet{pg: pg}
	for i, addr := range addrs {
		cp := &controlPlane{dir: base, config: filepath.Join(base, fmt.Sprintf("replica-%c", 'a'+i), "fleetd.toml")}
		if err := os.MkdirAll(filepath.Dir(cp.config), 0o700); err != nil {
			t.Fatal(err)
		}
		text := fmt.Sprintf("pki_dir = %q\ndata_dir = \"data\"\nlisten = %q\nlog_level = \"debug\"\nstore = %q\nadvertise_addresses = [%s]\n%s",
			pkiDir, addr, dsn, quoteList(addrs), extra)
		if err := os.WriteFile(cp.config, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(pkiDir, "pki-bundle.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &cp.bundle); err != nil {
			t.Fatal(err)
		}
		cp.serve(t)
		if cp.addr != addr {
			t.Fatalf("replica %d serves on %s, its config says %s", i, cp.addr, addr)
		}
		f.replicas = append(f.replicas, cp)
	}
	return f
}

func quoteList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// kill ends the replica with SIGKILL, as a crash would.
func (cp *controlPlane) kill(t *testing.T) {
	t.Helper()
	_ = cp.cmd.Process.Kill()
	<-cp.exited
	cp.cmd = nil
}

// holder returns the first replica whose log says it opened node's session.
func (f *fleet) holder(node string) int {
	re := regexp.MustCompile(`msg="session opened" node_id=` + regexp.QuoteMeta(node) + `(\s|$)`)
	for i, cp := range f.replicas {
		if re.MatchString(cp.log.String()) {
			return i
		}
	}
	return -1
}

// joinedOn returns the replica whose log says node joined there.
func (f *fleet) joinedOn(node string) int {
	re := regexp.MustCompile(`msg="node joined" node_id=` + regexp.QuoteMeta(node) + `(\s|$)`)
	for i, cp := range f.replicas {
		if re.MatchString(cp.log.String()) {
			return i
		}
	}
	return -1
}

var (
	revokedRE     = regexp.MustCompile(`msg="certificate revoked"`)
	sessionLostRE = regexp.MustCompile(`msg="session lost, reconnecting"`)
	renewFailRE   = regexp.MustCompile(`msg="renewal failed".*Unavailable`)
)

// TestThreeReplicasOnPostgreSQL is the end-to-end run: three fleetd
// replicas on one PostgreSQL; nodes join through different replicas; a
// revocation through one replica ends a session another holds; a token
// raced through two replicas is redeemed once; a certificate live on two
// replicas at once is revoked as cloned; a replica killed with
// SIGKILL leaves its nodes to reconnect to the others and keep renewing;
// with PostgreSQL stopped, joins are UNAVAILABLE with a pushback and the
// sessions stay; with PostgreSQL back, service resumes without a restart.
func TestThreeReplicasOnPostgreSQL(t *testing.T) {
	pg := pgtest.StartOwn(t)
	f := startReplicas(t, pg, 3, "node_cert_lifetime = \"20s\"\nrenewal_limit = 100000\n")
	a, b, c := f.replicas[0], f.replicas[1], f.replicas[2]
	// Renew every few seconds: 30% into a 25s life (5s backdated).
	const renewEarly = "[renewal]\nfraction = 0.3\n"

	// Each machine is configured with one replica only, and learns the
	// others from the well-known document.
	var machines []*machine
	var nodes []string
	for i, cp := range f.replicas {
		m := newMachine(t, cp, "", renewEarly)
		node := m.join(t, a)
		if got := f.joinedOn(node); got != i {
			t.Fatalf("node %s joined on replica %d, want %d (its configured one)", node, got, i)
		}
		machines, nodes = append(machines, m), append(nodes, node)
	}
	t.Logf("nodes %v joined through replicas a, b, c", nodes)

	agents := make([]*agentProc, len(machines))
	for i, m := range machines {
		agents[i] = startAgent(t, m)
		agents[i].waitFor(t, sessionOpenRE, 60*time.Second)
	}
	waitLog(t, func() bool { return f.holder(nodes[2]) >= 0 }, "replica c to log the session of "+nodes[2])

	t.Run("a revocation through replica a ends a session held on replica c", func(t *testing.T) {
		if h := f.holder(nodes[2]); h != 2 {
			t.Fatalf("the session of %s is on replica %d, want c", nodes[2], h)
		}
		start := time.Now()
		r := run(t, "", nil, "fleetd", "nodes", "revoke", nodes[2], "--reason", "disk stolen", "--config", a.config)
		if r.code != 0 {
			t.Fatalf("fleetd nodes revoke on replica a: %s", r)
		}
		agents[2].waitFor(t, revokedRE, 30*time.Second)
		t.Logf("revocation through replica a reached the node's session on replica c %s after the admin call started", time.Since(start).Round(time.Millisecond))
		if code := agents[2].wait(t, 30*time.Second); code != 1 {
			t.Errorf("bcd node exited %d after the revocation, want 1", code)
		}
		if !strings.Contains(c.log.String(), `msg="session ended by a revocation from another replica" node_id=`+nodes[2]) {
			t.Errorf("replica c's log does not say the revocation came from another replica:\n%s", c.log)
		}
		// The other nodes' daemons subscribed to the revocation feed: the
		// one on replica b hears of it through the store, the one on
		// replica a (where it was made) too.
		peerRevokedRE := regexp.MustCompile(`msg="revoked certificates of other nodes" .*certificates=1 catch_up=false`)
		agents[0].waitFor(t, peerRevokedRE, 30*time.Second)
		agents[1].waitFor(t, peerRevokedRE, 30*time.Second)
	})

	t.Run("a token raced through two replicas is redeemed once", func(t *testing.T) {
		tok := a.token(t, "--role", "worker")
		m1, m2 := newMachine(t, a, "", ""), newMachine(t, b, "", "")
		var wg sync.WaitGroup
		res := make([]result, 2)
		for i, m := range []*machine{m1, m2} {
			wg.Go(func() { res[i] = run(t, tok, m.env(), "bcd", "join", "--config", m.cfg) })
		}
		wg.Wait()
		won := 0
		for _, r := range res {
			if r.code == 0 && joinedRE.MatchString(r.stdout) {
				won++
			} else if !strings.Contains(r.stderr, "Join refused") {
				t.Errorf("the losing join did not fail with Join refused: %s", r)
			}
		}
		if won != 1 {
			t.Fatalf("%d joins won the token, want 1:\n%s\n%s", won, res[0], res[1])
		}
	})

	t.Run("a certificate live on two replicas at once is revoked as cloned", func(t *testing.T) {
		if h := f.holder(nodes[1]); h != 1 {
			t.Fatalf("the session of %s is on replica %d, want b", nodes[1], h)
		}
		// Another machine with a copy of the node's identity, configured
		// with replica a.
		clone := newMachine(t, a, "", "")
		copyDir(t, machines[1].dataDir, clone.dataDir)
		ca := startAgent(t, clone)
		ca.waitFor(t, revokedRE, 60*time.Second)
		agents[1].waitFor(t, revokedRE, 60*time.Second)
		if !strings.Contains(a.log.String(), "certificate looks cloned") {
			t.Errorf("replica a's log does not name the clone:\n%s", a.log)
		}
		if code := agents[1].wait(t, 30*time.Second); code != 1 {
			t.Errorf("the original bcd node exited %d, want 1", code)
		}
	})

	t.Run("a replica killed with SIGKILL: its nodes reconnect to the others and keep renewing", func(t *testing.T) {
		victim := f.holder(nodes[0])
		if victim < 0 {
			t.Fatalf("no replica logged the session of %s", nodes[0])
		}
		f.replicas[victim].kill(t)
		agents[0].waitFor(t, sessionLostRE, 60*time.Second)
		agents[0].waitFor(t, sessionOpenRE, 60*time.Second)
		agents[0].waitFor(t, renewedRE, 60*time.Second)
		agents[0].waitFor(t, renewedRE, 60*time.Second)
		// The victim's log stopped at the kill; the session is on another.
		re := regexp.MustCompile(`msg="session opened" node_id=` + regexp.QuoteMeta(nodes[0]) + `\b`)
		moved := false
		for i, cp := range f.replicas {
			if i != victim && re.MatchString(cp.log.String()) {
				moved = true
			}
		}
		if !moved {
			t.Errorf("no other replica logged the session of %s after replica %d was killed", nodes[0], victim)
		}
	})

	t.Run("PostgreSQL stopped: joins are UNAVAILABLE with a pushback, sessions stay; back: service resumes", func(t *testing.T) {
		var live *controlPlane
		for _, cp := range f.replicas {
			if cp.cmd != nil {
				live = cp
				break
			}
		}
		tok := live.token(t, "--role", "worker")
		req := sealedJoin(t, live, tok)
		before := len(agents[0].log.String())
		pg.Stop(t)
		code, pushback := joinOnce(t, live, req)
		if code != codes.Unavailable || pushback == "" {
			t.Fatalf("a join with PostgreSQL stopped: %s with pushback %q, want UNAVAILABLE with a pushback", code, pushback)
		}
		t.Logf("join with PostgreSQL stopped: %s, grpc-retry-pushback-ms %s", code, pushback)
		// A renewal meanwhile is refused the same way; the node keeps its
		// certificate and its session.
		agents[0].waitFor(t, renewFailRE, 60*time.Second)
		pg.Restart(t)
		deadline := time.Now().Add(60 * time.Second)
		for {
			code, _ = joinOnce(t, live, req)
			if code == codes.OK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("joins did not resume within 60s of PostgreSQL's return: last %s", code)
			}
			time.Sleep(500 * time.Millisecond)
		}
		agents[0].waitFor(t, renewedRE, 60*time.Second)
		during := agents[0].log.String()[before:]
		if sessionLostRE.MatchString(during) || revokedRE.MatchString(during) {
			t.Errorf("the node's session did not stay up while PostgreSQL was away:\n%s", during)
		}
	})
}

// copyDir copies the files of src (one level) into dst, keeping modes.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	es, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if !e.Type().IsRegular() {
			continue
		}
		fi, _ := e.Info()
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// waitLog polls cond, for a fleetd log line written by another process.
func waitLog(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sealedJoin builds a token join request for cp with a fresh key.
func sealedJoin(t *testing.T, cp *controlPlane, token string) *joinv1.JoinRequest {
	t.Helper()
	jwk, err := os.ReadFile(filepath.Join(filepath.Dir(cp.config), "..", "pki", "join-encryption.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	enc, err := pki.ParseJWK(jwk)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pki.GenerateKey()
	csr, err := pki.CreateCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(csr)
	sealed, err := pki.SealToken(enc, h[:], []byte(token))
	if err != nil {
		t.Fatal(err)
	}
	return &joinv1.JoinRequest{Csr: csr, Attestor: "token", SealedToken: sealed,
		Claims: &joinv1.HardwareClaims{Hostname: "raw-join"}, Role: "worker"}
}

// joinOnce sends req to cp once and returns the code and the pushback
// trailer.
func joinOnce(t *testing.T, cp *controlPlane, req *joinv1.JoinRequest) (codes.Code, string) {
	t.Helper()
	conn, _, _, err := agent.Dial([]string{cp.addr}, "fleetd.test", parsePins(t, cp).ServingCA, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var tr metadata.MD
	_, err = joinv1.NewJoinServiceClient(conn).Join(ctx, req, grpc.Trailer(&tr))
	pb := tr.Get("grpc-retry-pushback-ms")
	if len(pb) == 0 {
		return status.Code(err), ""
	}
	return status.Code(err), pb[0]
}
