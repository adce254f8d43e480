package integration

import (
	"context"
	"crypto/sha256"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// ekRootsConfig writes the swtpm local CA's certificates and returns the
// fleetd.toml lines that trust them as TPM manufacturer roots.
func ekRootsConfig(t *testing.T, sw *tpmtest.Swtpm) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "ek-root.pem")
	inter := filepath.Join(dir, "ek-issuer.pem")
	for path, c := range map[string][]byte{root: sw.RootCertificate(t).Raw, inter: sw.IssuerCertificate(t).Raw} {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c}), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return "[tpm]\nek_roots = [\"" + root + "\"]\nek_intermediates = [\"" + inter + "\"]\n"
}

func TestTPMJoinReclaimRenewAndClear(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	cp := startControlPlane(t, "node_cert_lifetime = \"4s\"\n"+ekRootsConfig(t, sw))
	m := newMachine(t, cp, "", "tpm = \""+sw.Spec()+"\"\n")

	tok := cp.token(t, "--role", "gpu", "--site", "rack7")
	r := run(t, tok, m.env(), "bcd", "join", "--config", m.cfg, "--attestor", "tpm")
	mm := joinedRE.FindStringSubmatch(r.stdout)
	if r.code != 0 || mm == nil {
		t.Fatalf("tpm join with a token: %s", r)
	}
	node := mm[1]
	st, err := loadWithTPM(t, sw, m.dataDir)
	if err != nil {
		t.Fatalf("the identity of a tpm join does not load: %v", err)
	}
	if st.Identity.KeyKind != identity.KeyKindTPM || len(st.Identity.TPMAK) == 0 || st.Identity.Attestor != "tpm" {
		t.Errorf("identity after a tpm join: key %s, attestor %s, AK record %d bytes", st.Identity.KeyKind, st.Identity.Attestor, len(st.Identity.TPMAK))
	}
	keyPEM, _ := os.ReadFile(filepath.Join(m.dataDir, "node.key"))
	if !strings.Contains(string(keyPEM), "NODETRUST TPM KEY") {
		t.Errorf("node.key holds no TPM record:\n%s", keyPEM)
	}
	verifySVID(t, st) // a TPM join's certificate
	ak := akNameOf(t, st.Leaf)
	if len(ak) == 0 {
		t.Fatalf("the certificate of a tpm join names no AK")
	}

	t.Run("the same EK reclaims its node without a token", func(t *testing.T) {
		r := run(t, "", m.env(), "bcd", "join", "--config", m.cfg, "--attestor", "tpm", "--reset", "--yes")
		mm := joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout)))
		if r.code != 0 || mm == nil || mm[1] != node || mm[2] != "rack7" || mm[3] != "gpu" {
			t.Fatalf("tpm rejoin without a token: %s", r)
		}
		show := run(t, "", nil, "fleetd", "nodes", "show", node, "--config", cp.config, "--json")
		if !strings.Contains(show.stdout, `"identity_generation": 2`) || !strings.Contains(show.stdout, `"attestor": "tpm"`) {
			t.Errorf("after the reclaim: %s", show.stdout)
		}
		st, err := loadWithTPM(t, sw, m.dataDir)
		if err != nil {
			t.Fatal(err)
		}
		verifySVID(t, st) // a reclaim's certificate
	})

	t.Run("renewals are certified by the AK", func(t *testing.T) {
		runUntilRenewed(t, m, 2)
		st, err := loadWithTPM(t, sw, m.dataDir)
		if err != nil {
			t.Fatal(err)
		}
		if st.Identity.RenewedAt.IsZero() || st.Identity.KeyKind != identity.KeyKindTPM {
			t.Errorf("after renewals: renewed at %v, key %s", st.Identity.RenewedAt, st.Identity.KeyKind)
		}
		verifySVID(t, st) // a TPM-certified renewal's certificate
		if len(akNameOf(t, st.Leaf)) == 0 {
			t.Errorf("the renewed certificate names no AK")
		}
	})

	t.Run("a cleared TPM says so", func(t *testing.T) {
		fresh := tpmtest.StartSwtpm(t)
		cfg, err := os.ReadFile(m.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(m.cfg, []byte(strings.Replace(string(cfg), sw.Spec(), fresh.Spec(), 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, "", nil, "bcd", "status", "--config", m.cfg)
		if r.code != 1 || !strings.Contains(r.stderr, "the TPM derives another key from node.key (was the TPM cleared?)") {
			t.Errorf("status on a cleared TPM: %s", r)
		}
	})
}

// loadWithTPM loads the identity in dataDir with the swtpm's keys.
func loadWithTPM(t *testing.T, sw *tpmtest.Swtpm, dataDir string) (*identity.State, error) {
	t.Helper()
	tp, err := tpm.Open(sw.Spec())
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	st, err := identity.LoadState(dataDir, identity.LoadOptions{KeyLoader: agent.Keys{TPM: agent.Direct(tp)}.Loader(context.Background())})
	if st != nil {
		if c, ok := st.Key.(interface{ Close() error }); ok {
			c.Close()
		}
	}
	return st, err
}

func TestTPMJoinRefusesAnUnknownEK(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	cp := startControlPlane(t, "") // no manufacturer roots: the EK is unknown
	m := newMachine(t, cp, "", "tpm = \""+sw.Spec()+"\"\n")
	r := run(t, cp.token(t, "--role", "worker"), m.env(), "bcd", "join", "--config", m.cfg, "--attestor", "tpm")
	assertRefused(t, r)
	if !strings.Contains(cp.log.String(), "unknown EK") {
		t.Errorf("the server did not log why:\n%s", cp.log)
	}
}

// tpmClient speaks the tpm attestor by hand, to misbehave in ways bcd
// never does.
type tpmClient struct {
	t      *testing.T
	cp     *controlPlane
	tp     *tpm.TPM
	client joinv1.JoinServiceClient
	req    *joinv1.JoinRequest
	ek     *tpm.EK
	ak     *tpm.AK
}

func newTPMClient(t *testing.T, cp *controlPlane, sw *tpmtest.Swtpm) *tpmClient {
	t.Helper()
	tp := sw.Open(t)
	ctx := context.Background()
	key, _, err := tp.NewNodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { key.Close() })
	csr, err := pki.CreateCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(csr)
	certs, err := tp.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := tp.EK(ctx, tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	ak, _, err := tp.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ak.Close() })
	attest, sig, err := tp.Certify(ctx, ak, key, h[:])
	if err != nil {
		t.Fatal(err)
	}
	jwkBytes, err := os.ReadFile(filepath.Join(cp.dir, "pki", "join-encryption.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	jwk, err := pki.ParseJWK(jwkBytes)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := pki.SealToken(jwk, h[:], []byte(cp.token(t, "--role", "worker")))
	if err != nil {
		t.Fatal(err)
	}
	pins := parsePins(t, cp)
	conn, _, _, err := agent.Dial([]string{cp.addr}, "fleetd.test", pins.ServingCA, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	idx := ek.Kind.CertIndex()
	return &tpmClient{t: t, cp: cp, tp: tp, client: joinv1.NewJoinServiceClient(conn), ek: ek, ak: ak, req: &joinv1.JoinRequest{
		Csr: csr, Attestor: "tpm", SealedToken: sealed, Role: "worker",
		Tpm: &joinv1.TpmEvidence{EkCertificate: certs[idx], EkCertificateIndex: idx, EkPublic: ek.PublicArea,
			AkPublic: ak.PublicArea(), NodeKeyPublic: key.PublicArea(), CertifyAttest: attest, CertifySignature: sig},
	}}
}

func (c *tpmClient) send() (*joinv1.JoinResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.client.Join(ctx, c.req)
}

// answer answers ch; with wrong set, with a secret the TPM did not
// release.
func (c *tpmClient) answer(ch *joinv1.JoinChallenge, wrong bool) {
	ctx := context.Background()
	secret, err := c.tp.ActivateCredential(ctx, c.ak, c.ek, ch.CredentialBlob, ch.EncryptedSecret)
	if err != nil {
		c.t.Fatal(err)
	}
	if wrong {
		secret[0] ^= 1
	}
	quoted, sig, values, err := c.tp.Quote(ctx, c.ak, ch.Nonce, tpm.BootPCRs)
	if err != nil {
		c.t.Fatal(err)
	}
	pcrs := map[uint32][]byte{}
	for i, v := range values {
		pcrs[uint32(i)] = v
	}
	c.req.DeferralId = ch.DeferralId
	c.req.Answer = &joinv1.ChallengeAnswer{Round: ch.Round, ActivatedSecret: secret, QuoteAttest: quoted, QuoteSignature: sig, Pcrs: pcrs}
}

func TestTPMChallengeAnswersCannotBeReplayedAndRoundsEndAtThree(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	cp := startControlPlane(t, ekRootsConfig(t, sw))

	t.Run("a replayed round-2 answer is refused", func(t *testing.T) {
		c := newTPMClient(t, cp, sw)
		resp, err := c.send()
		if err != nil || resp.GetChallenge() == nil || resp.GetChallenge().Round != 1 {
			t.Fatalf("round 1: %v, %v", resp, err)
		}
		c.answer(resp.GetChallenge(), false)
		resp, err = c.send()
		if err != nil || resp.GetSigned() == nil {
			t.Fatalf("a right answer was not signed: %v, %v", resp, err)
		}
		_, err = c.send()
		if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "Join refused" {
			t.Errorf("the replayed answer: %v, want PERMISSION_DENIED Join refused", err)
		}
	})

	t.Run("a fourth challenge round is never sent", func(t *testing.T) {
		c := newTPMClient(t, cp, sw)
		resp, err := c.send()
		var rounds []uint32
		for err == nil && resp.GetChallenge() != nil {
			rounds = append(rounds, resp.GetChallenge().Round)
			if len(rounds) > 4 {
				break
			}
			c.answer(resp.GetChallenge(), true)
			resp, err = c.send()
		}
		if len(rounds) != 3 || rounds[0] != 1 || rounds[2] != 3 {
			t.Errorf("rounds %v, want 1 2 3", rounds)
		}
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("after three wrong answers: %v, %v; want Join refused", resp, err)
		}
	})
	if !strings.Contains(cp.log.String(), "challenge round 3 failed, the last") {
		t.Errorf("the server did not log the last failed round:\n%s", cp.log)
	}
}

func TestAFileKeyNodeMovesIntoTheTPMAtItsNextRenewal(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	cp := startControlPlane(t, "node_cert_lifetime = \"4s\"\n")
	m := newMachine(t, cp, "", "tpm = \"off\"\n")
	m.join(t, cp)
	if b, _ := os.ReadFile(filepath.Join(m.dataDir, "node.key")); !strings.Contains(string(b), "PRIVATE KEY") {
		t.Fatalf("with tpm = off the node key is not a file:\n%s", b)
	}
	// The machine gets a TPM.
	cfg, err := os.ReadFile(m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.cfg, []byte(strings.Replace(string(cfg), `tpm = "off"`, `tpm = "`+sw.Spec()+`"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, m)
	a.waitFor(t, renewedRE, 60*time.Second)
	_ = a.cmd.Process.Signal(os.Interrupt)
	a.wait(t, 30*time.Second)
	st, err := loadWithTPM(t, sw, m.dataDir)
	if err != nil {
		t.Fatalf("after the move: %v", err)
	}
	if st.Identity.KeyKind != identity.KeyKindTPM {
		t.Errorf("key kind after the renewal: %s, want tpm", st.Identity.KeyKind)
	}
	if b, _ := os.ReadFile(filepath.Join(m.dataDir, "node.key")); !strings.Contains(string(b), "NODETRUST TPM KEY") {
		t.Errorf("node.key after the renewal holds no TPM record:\n%s", b)
	}
}
