package integration

import (
	"context"
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/postgres/pgtest"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// TestJoinRoundsAndReclaimAcrossReplicas: what one join or identity spreads
// over several requests works when they land on different replicas of one
// PostgreSQL database. A tpm challenge issued by replica a is answered
// through replica b (driven at the gRPC level with the project's client
// code and a swtpm: bcd keeps one connection for a join's rounds); a
// reclaim by the same EK through another replica ends the old identity's session
// held on another replica (real bcd); a join pending on one replica,
// approved through a second, completes through the third once the first
// two are gone (real bcd, which moves between the addresses it is given).
func TestJoinRoundsAndReclaimAcrossReplicas(t *testing.T) {
	pg := pgtest.Start(t)
	swSplit, swReclaim, swApproval := tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t)
	f := startReplicas(t, pg, 3, "pending_poll = \"1s\"\n"+ekRootsConfig(t, swSplit, swReclaim, swApproval))
	a, b, c := f.replicas[0], f.replicas[1], f.replicas[2]

	t.Run("a tpm challenge issued by replica a is answered through replica b", func(t *testing.T) {
		ctx := t.Context()
		tp := swSplit.Open(t)
		j := newRawTPMJoin(t, ctx, agent.Direct(tp), a, a.token(t, "--role", "gpu"))

		ch := j.send(t, a).GetChallenge()
		if ch == nil || ch.Round != 1 {
			t.Fatalf("replica a answered %v, want challenge round 1", ch)
		}
		waitLogRE(t, a, regexp.MustCompile(`msg="tpm challenge" round=1`), "replica a to log its challenge")
		j.answer(t, ctx, ch)
		signed := j.send(t, b).GetSigned()
		if signed == nil {
			t.Fatal("replica b did not sign the join whose challenge replica a issued")
		}
		node := nodeJoinedOn(t, b, "tpm")
		if strings.Contains(a.log.String(), `msg="node joined" node_id=`+node+" ") {
			t.Errorf("replica a logged the join too")
		}
		t.Logf("challenge round 1 from replica a, answer through replica b: node %s joined", node)

		// The round was taken once: the same answer again, through c,
		// is refused.
		_, err := j.call(t, c)
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("the same answer replayed through replica c: %v, want PERMISSION_DENIED", err)
		}
	})

	t.Run("a reclaim by the same EK through another replica ends the old session", func(t *testing.T) {
		m1 := newMachine(t, a, "", "tpm = \""+swReclaim.Spec()+"\"\n")
		tok := a.token(t, "--role", "gpu")
		r := run(t, tok, m1.env(), "bcd", "join", "--config", m1.cfg, "--attestor", "tpm")
		mm := joinedRE.FindStringSubmatch(r.stdout)
		if r.code != 0 || mm == nil {
			t.Fatalf("tpm join through replica a: %s", r)
		}
		node := mm[1]
		// The same TPM state in a second swtpm (bcd node holds the
		// first's one connection): the same EK, joining again elsewhere.
		twin := swReclaim.Twin(t)
		old := startAgent(t, m1)
		old.waitFor(t, sessionOpenRE, 60*time.Second)
		waitLog(t, func() bool { return f.holder(node) >= 0 }, "a replica to log the session of "+node)
		holder := f.replicas[f.holder(node)]
		other := f.replicas[(f.holder(node)+1)%len(f.replicas)]

		m2 := newMachine(t, other, "", "tpm = \""+twin.Spec()+"\"\n")
		r = run(t, "", m2.env(), "bcd", "join", "--config", m2.cfg, "--attestor", "tpm")
		mm = joinedRE.FindStringSubmatch(r.stdout)
		if r.code != 0 || mm == nil || mm[1] != node {
			t.Fatalf("the same EK joining through another replica: %s, want node %s reclaimed", r, node)
		}
		waitLogRE(t, other, regexp.MustCompile(`msg="node joined" node_id=`+regexp.QuoteMeta(node)+` .*reclaim=true identity_generation=2`), "the other replica to log the reclaim")
		old.waitFor(t, revokedRE, 30*time.Second)
		if code := old.wait(t, 30*time.Second); code != 1 {
			t.Errorf("the old identity's bcd node exited %d, want 1", code)
		}
		waitLogRE(t, holder, regexp.MustCompile(`msg="session ended by a revocation from another replica" node_id=`+regexp.QuoteMeta(node)+` identity_generation=2 reason=reclaimed`),
			"the session's replica to log that the reclaim through another replica ended it")
	})

	t.Run("a join pending on one replica, approved through a second, completes through the third", func(t *testing.T) {
		// The machine knows all three addresses; bcd takes them in a
		// random order.
		m := newMachine(t, a, "", "servers = [\""+b.addr+"\", \""+c.addr+"\"]\ntpm = \""+swApproval.Spec()+"\"\n[join]\nattestor = \"tpm\"\n")
		tok := a.token(t, "--role", "worker", "--require-approval")
		j := startJoin(t, m, tok)
		j.waitFor(t, regexp.MustCompile(`^bcd: waiting for the control plane's approval`), 60*time.Second)
		pendingRE := regexp.MustCompile(`msg="join waiting for approval"`)
		p := -1
		waitLog(t, func() bool {
			for i, cp := range f.replicas {
				if pendingRE.MatchString(cp.log.String()) {
					p = i
				}
			}
			return p >= 0
		}, "a replica to log the pending join")
		pending, approver, third := f.replicas[p], f.replicas[(p+1)%3], f.replicas[(p+2)%3]
		// Freeze the pending join's replica, so that no poll reaches it
		// after the approval: the join must finish elsewhere.
		if err := pending.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		node := approvePending(t, approver, m)
		approver.kill(t)
		pending.kill(t)
		j.waitFor(t, regexp.MustCompile(`^joined as `+regexp.QuoteMeta(node)+` `), 90*time.Second)
		if code := j.wait(t, 30*time.Second); code != 0 {
			t.Errorf("bcd join exited %d:\n%s", code, j.log)
		}
		if got := nodeJoinedOn(t, third, "tpm"); got != node {
			t.Errorf("the third replica logged the join of %s, want %s", got, node)
		}
		// After the approval the TPM proved itself again, to the third.
		waitLogRE(t, third, regexp.MustCompile(`msg="tpm challenge" round=1`), "the third replica to log a challenge round after the approval")
		t.Logf("pending on replica %d, approved through replica %d, completed through replica %d", p, (p+1)%3, (p+2)%3)
	})
}

var tpmJoinedRE = regexp.MustCompile(`msg="node joined" node_id=(\S+) attestor=(\S+)`)

// nodeJoinedOn waits for cp to log a join of attestor and returns the
// node id of the last one.
func nodeJoinedOn(t *testing.T, cp *controlPlane, attestor string) string {
	t.Helper()
	node := ""
	waitLog(t, func() bool {
		for _, m := range tpmJoinedRE.FindAllStringSubmatch(cp.log.String(), -1) {
			if m[2] == attestor {
				node = m[1]
			}
		}
		return node != ""
	}, "a "+attestor+" join in the log of "+cp.addr)
	return node
}

// waitLogRE waits for a line of cp's log to match re (the log is read
// from the process's output, a little after it is written).
func waitLogRE(t *testing.T, cp *controlPlane, re *regexp.Regexp, what string) {
	t.Helper()
	waitLog(t, func() bool { return re.MatchString(cp.log.String()) }, what)
}

// rawTPMJoin is a tpm join driven request by request, as bcd's join does
// it (internal/bcd/agent/tpmjoin.go), so that each request can go to
// another replica.
type rawTPMJoin struct {
	t   agent.TPM
	ek  *tpm.EK
	ak  tpm.AttestationKey
	req *joinv1.JoinRequest
}

// newRawTPMJoin makes the node key and the AK in the TPM and builds the
// first request, with the token sealed to cp's join encryption key.
func newRawTPMJoin(t *testing.T, ctx context.Context, tp agent.TPM, cp *controlPlane, token string) *rawTPMJoin {
	t.Helper()
	key, _, _, err := agent.Keys{TPM: tp}.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cl, ok := key.(io.Closer); ok {
		t.Cleanup(func() { _ = cl.Close() })
	}
	nodeKey, ok := key.(tpm.NodeKey)
	if !ok {
		t.Fatalf("the node key is a %T, not a TPM key", key)
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(csr)
	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	j := &rawTPMJoin{t: tp}
	if j.ek, err = tp.EK(ctx, tpm.EKAuto); err != nil {
		t.Fatal(err)
	}
	if j.ak, _, err = tp.NewAK(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.ak.Close() })
	attest, sig, err := tp.Certify(ctx, j.ak, nodeKey, h[:])
	if err != nil {
		t.Fatal(err)
	}
	jwk, err := os.ReadFile(filepath.Join(cp.dir, "pki", "join-encryption.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	enc, err := pki.ParseJWK(jwk)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := pki.SealToken(enc, h[:], []byte(token))
	if err != nil {
		t.Fatal(err)
	}
	idx := j.ek.Kind.CertIndex()
	j.req = &joinv1.JoinRequest{Csr: csr, Attestor: "tpm", SealedToken: sealed, Role: "gpu",
		Claims: &joinv1.HardwareClaims{Hostname: "raw-tpm-join"},
		Tpm: &joinv1.TpmEvidence{
			EkCertificate: certs[idx], EkCertificateIndex: idx, EkPublic: j.ek.PublicArea,
			AkPublic: j.ak.PublicArea(), NodeKeyPublic: nodeKey.PublicArea(),
			CertifyAttest: attest, CertifySignature: sig,
		}}
	return j
}

// answer activates the challenge's credential and quotes the boot PCRs
// over its nonce, for the next request.
func (j *rawTPMJoin) answer(t *testing.T, ctx context.Context, ch *joinv1.JoinChallenge) {
	t.Helper()
	secret, err := j.t.ActivateCredential(ctx, j.ak, j.ek, ch.CredentialBlob, ch.EncryptedSecret)
	if err != nil {
		t.Fatal(err)
	}
	quoted, sig, values, err := j.t.Quote(ctx, j.ak, ch.Nonce, tpm.BootPCRs)
	if err != nil {
		t.Fatal(err)
	}
	pcrs := make(map[uint32][]byte, len(values))
	for i, v := range values {
		pcrs[uint32(i)] = v
	}
	j.req.DeferralId = ch.DeferralId
	j.req.Answer = &joinv1.ChallengeAnswer{Round: ch.Round, ActivatedSecret: secret, QuoteAttest: quoted, QuoteSignature: sig, Pcrs: pcrs}
}

// call sends the request to cp, on a connection of its own.
func (j *rawTPMJoin) call(t *testing.T, cp *controlPlane) (*joinv1.JoinResponse, error) {
	t.Helper()
	conn, _, _, err := agent.Dial([]string{cp.addr}, "fleetd.test", parsePins(t, cp).ServingCA, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	return joinv1.NewJoinServiceClient(conn).Join(ctx, j.req)
}

// send is call that must succeed.
func (j *rawTPMJoin) send(t *testing.T, cp *controlPlane) *joinv1.JoinResponse {
	t.Helper()
	resp, err := j.call(t, cp)
	if err != nil {
		t.Fatalf("join through %s: %v", cp.addr, err)
	}
	return resp
}
