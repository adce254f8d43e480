//go:build tpmsim

package service_test

import (
	"crypto/sha256"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// The tpm attestor's handler against evidence of the in-process reference
// simulator (build tag tpmsim, cgo): the TPM's side is made here with
// package tpm, so each step can be sent wrong on purpose. The simulator is
// one per process: these tests do not run in parallel.

// tpmMachine is a machine with a simulated TPM whose EK certificate a test
// manufacturer signed.
type tpmMachine struct {
	tp      *tpm.TPM
	ek      *tpm.EK
	ekCert  []byte
	ak      *tpm.AK
	key     *tpm.Key
	csr     []byte
	csrHash []byte
}

// newTPMMachine opens the simulator, has a new test manufacturer
// provision its RSA EK certificate, and makes an AK and a node key with its
// CSR. It returns the manufacturer's root pool.
func newTPMMachine(t *testing.T) (*tpmMachine, *x509.CertPool) {
	t.Helper()
	return newBootedTPMMachine(t, nil)
}

// newBootedTPMMachine is newTPMMachine whose TPM measured boot first, as
// firmware does (nil: nothing measured).
func newBootedTPMMachine(t *testing.T, boot *tpmtest.EventLog) (*tpmMachine, *x509.CertPool) {
	t.Helper()
	tp, tr := tpmtest.OpenSim(t)
	if boot != nil {
		boot.Extend(t, tr)
	}
	mfr := tpmtest.NewManufacturer(t, "service test TPM manufacturer", nil)
	m := &tpmMachine{tp: tp, ekCert: mfr.Provision(t, tp, tr, tpm.EKRSA2048)}
	var err error
	if m.ek, err = tp.EK(t.Context(), tpm.EKRSA2048); err != nil {
		t.Fatal(err)
	}
	if m.ak, _, err = tp.NewAK(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.ak.Close() })
	m.key, m.csr, m.csrHash = m.newKey(t)
	return m, mfr.Pool()
}

// newKey makes a node key in the TPM and its CSR.
func (m *tpmMachine) newKey(t *testing.T) (*tpm.Key, []byte, []byte) {
	t.Helper()
	key, _, err := m.tp.NewNodeKey(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = key.Close() })
	csr, err := pki.CreateCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(csr)
	return key, csr, h[:]
}

// request is the machine's first tpm join request, with the token secret
// sealed to its CSR when secret is set.
func (m *tpmMachine) request(t *testing.T, e *env, secret string) *joinv1.JoinRequest {
	t.Helper()
	att, sig, err := m.tp.Certify(t.Context(), m.ak, m.key, m.csrHash)
	if err != nil {
		t.Fatal(err)
	}
	req := &joinv1.JoinRequest{
		Csr: m.csr, Attestor: "tpm", DaemonVersion: "test",
		Claims: &joinv1.HardwareClaims{ProductUuid: "00000000-0000-4000-8000-0000000000aa", Hostname: "gpu-1"},
		Tpm: &joinv1.TpmEvidence{
			EkCertificate: m.ekCert, EkCertificateIndex: tpm.EKCertIndexRSA2048, EkPublic: m.ek.PublicArea,
			AkPublic: m.ak.PublicArea(), NodeKeyPublic: m.key.PublicArea(), CertifyAttest: att, CertifySignature: sig,
		},
	}
	if secret != "" {
		req.SealedToken = e.seal(t, m.csrHash, secret)
	}
	return req
}

// answer answers a challenge as the TPM does: it activates the credential
// and quotes the boot PCRs over the nonce.
func (m *tpmMachine) answer(t *testing.T, ch *joinv1.JoinChallenge) *joinv1.ChallengeAnswer {
	t.Helper()
	secret, err := m.tp.ActivateCredential(t.Context(), m.ak, m.ek, ch.CredentialBlob, ch.EncryptedSecret)
	if err != nil {
		t.Fatal(err)
	}
	quoted, sig, values, err := m.tp.Quote(t.Context(), m.ak, ch.Nonce, tpm.BootPCRs)
	if err != nil {
		t.Fatal(err)
	}
	pcrs := map[uint32][]byte{}
	for i, v := range values {
		pcrs[uint32(i)] = v
	}
	return &joinv1.ChallengeAnswer{Round: ch.Round, ActivatedSecret: secret, QuoteAttest: quoted, QuoteSignature: sig, Pcrs: pcrs}
}

// challenge sends req and returns the challenge it must get.
func challenge(t *testing.T, e *env, req *joinv1.JoinRequest) *joinv1.JoinChallenge {
	t.Helper()
	resp, err := e.join.Join(t.Context(), req)
	if err != nil {
		t.Fatalf("tpm join round: %v", err)
	}
	ch := resp.GetChallenge()
	if ch == nil || ch.DeferralId == "" || len(ch.Nonce) != 32 {
		t.Fatalf("answer %v, want a challenge", resp)
	}
	return ch
}

// tpmJoin runs a tpm join of m to the end and returns the node.
func tpmJoin(t *testing.T, e *env, m *tpmMachine, secret string) *node {
	t.Helper()
	req := m.request(t, e, secret)
	ch := challenge(t, e, req)
	req.DeferralId, req.Answer = ch.DeferralId, m.answer(t, ch)
	resp, err := e.join.Join(t.Context(), req)
	if err != nil || resp.GetSigned() == nil {
		t.Fatalf("tpm join answer: %v %v", resp, err)
	}
	o := e.open(t, resp.GetSigned(), m.csrHash, m.key.Public())
	return &node{id: o.Result.NodeId, gen: o.Result.IdentityGeneration, key: m.key, chain: o.Result.Chain, leaf: o}
}

// tpmEnv starts a server that trusts EK certificates under roots; nil
// roots trust none (no EKVerifier).
func tpmEnv(t *testing.T, roots *x509.CertPool) *env {
	t.Helper()
	if roots == nil {
		return newEnv(t)
	}
	v, err := attest.New(attest.Config{Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(t, func(c *service.Config) { c.EKVerifier = v })
}

func TestSimTPMJoin(t *testing.T) {
	m, roots := newTPMMachine(t)
	e := tpmEnv(t, roots)
	secret, _ := e.token(t, &adminv1.CreateTokenRequest{Role: "gpu", Site: "rack7"})
	n := tpmJoin(t, e, m, secret)

	if n.id != "gpu-1" || n.gen != 1 || string(n.leaf.Info.TPMAKName) != string(m.ak.Name()) {
		t.Fatalf("tpm join made %s generation %d naming AK %x, want gpu-1, 1, AK %x", n.id, n.gen, n.leaf.Info.TPMAKName, m.ak.Name())
	}
	stored := e.storedNode(t, n.id)
	ekPin, err := attest.EKPin(m.ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Attestor != "tpm" || stored.EKPin != ekPin || stored.Role != "gpu" || stored.Site != "rack7" {
		t.Errorf("stored node %+v, want a tpm node with EK pin %s", stored, ekPin)
	}
	if tok := e.storedToken(t, secret); tok.UsedBy != n.id {
		t.Errorf("token used by %q", tok.UsedBy)
	}

	parent := t
	t.Run("the same EK reclaims its node without a token", func(t *testing.T) {
		// The simulator holds three objects: the old key goes first. The
		// new one is the node's for the next subtest too.
		old := m.key
		m.key, m.csr, m.csrHash = m.newKey(parent)
		_ = old.Close()
		again := tpmJoin(t, e, m, "")
		if again.id != n.id || again.gen != 2 {
			t.Fatalf("reclaim made %s generation %d, want %s generation 2", again.id, again.gen, n.id)
		}
		if c := e.storedCert(t, n.serial()); c.RevokedReason != "reclaimed" {
			t.Errorf("the first certificate is %+v, want it revoked as reclaimed", c)
		}
		if a := e.audit(t, "join"); len(a) != 2 || a[0].Actor != "ek:"+ekPin {
			t.Errorf("join audit %+v, want the reclaim by ek:%s on top", a, ekPin)
		}
		n = again
	})

	t.Run("a renewal must be certified by the AK the certificate names", func(t *testing.T) {
		client, _ := e.nodeClients(t, n)
		// Three objects fit in the simulator: the AK, the current key,
		// and one more, in turn another AK and the next key.
		other, _, err := m.tp.NewAK(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		otherAK := other.PublicArea()
		_ = other.Close()
		next, csr, h := m.newKey(t)
		att, sig, err := m.tp.Certify(t.Context(), m.ak, next, h)
		if err != nil {
			t.Fatal(err)
		}
		curKey := n.key.(*tpm.Key)
		curAtt, curSig, err := m.tp.Certify(t.Context(), m.ak, curKey, h)
		if err != nil {
			t.Fatal(err)
		}
		now := e.clock.Now().UnixNano()
		proof, err := pki.SignRenewProof(n.key, h, now)
		if err != nil {
			t.Fatal(err)
		}
		base := func() *joinv1.RenewRequest {
			return &joinv1.RenewRequest{Csr: csr, Chain: n.chain, ClientTimeUnixNano: now, Proof: proof,
				KeyAttestation: &joinv1.KeyAttestation{AkPublic: m.ak.PublicArea(), KeyPublic: next.PublicArea(), CertifyAttest: att, CertifySignature: sig}}
		}
		cases := []struct {
			name string
			edit func(r *joinv1.RenewRequest)
			code codes.Code
			msg  string
		}{
			{name: "a renewal without the AK's certification", edit: func(r *joinv1.RenewRequest) { r.KeyAttestation = nil },
				code: codes.PermissionDenied, msg: "the certificate names a TPM AK: the renewal needs that AK's certification of the new key"},
			{name: "an AK public area that does not parse", edit: func(r *joinv1.RenewRequest) { r.KeyAttestation.AkPublic = []byte{1} },
				code: codes.InvalidArgument, msg: "AK public area"},
			{name: "a certification by another AK of the same TPM", edit: func(r *joinv1.RenewRequest) { r.KeyAttestation.AkPublic = otherAK },
				code: codes.PermissionDenied, msg: "the new key is certified by AK"},
			{name: "a certification whose signature does not verify", edit: func(r *joinv1.RenewRequest) {
				bad := append([]byte(nil), sig...)
				bad[len(bad)-1] ^= 1
				r.KeyAttestation.CertifySignature = bad
			}, code: codes.PermissionDenied, msg: "the AK's certification of the new key"},
			{name: "a certification that is not of the key public area sent", edit: func(r *joinv1.RenewRequest) {
				r.KeyAttestation.KeyPublic = curKey.PublicArea()
			}, code: codes.PermissionDenied, msg: "the AK's certification of the new key"},
			{name: "a certification of another key than the CSR's", edit: func(r *joinv1.RenewRequest) {
				r.KeyAttestation.KeyPublic, r.KeyAttestation.CertifyAttest, r.KeyAttestation.CertifySignature = curKey.PublicArea(), curAtt, curSig
			}, code: codes.PermissionDenied, msg: "the AK certified another key than the CSR's"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				r := base()
				tc.edit(r)
				_, err := client.Renew(t.Context(), r)
				wantStatus(t, err, tc.code, tc.msg)
			})
		}
		t.Run("the AK's certification of the new key renews, naming the same AK", func(t *testing.T) {
			resp, err := client.Renew(t.Context(), base())
			if err != nil {
				t.Fatal(err)
			}
			o := e.open(t, resp.Signed, h, next.Public())
			if string(o.Info.TPMAKName) != string(m.ak.Name()) || o.Result.IdentityGeneration != n.gen {
				t.Errorf("renewed leaf names AK %x generation %d", o.Info.TPMAKName, o.Result.IdentityGeneration)
			}
		})
	})
}

func TestSimTPMJoinRefusals(t *testing.T) {
	cases := []struct {
		name string
		// noVerifier: the server has no EK verifier; otherRoots: its
		// verifier trusts another manufacturer.
		noVerifier, otherRoots bool
		token                  *adminv1.CreateTokenRequest // nil: no token
		// round1 edits the first request; round2 edits the answer's
		// request, given the challenge. nil round2 means round 1 is
		// refused.
		round1 func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest)
		round2 func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest, ch *joinv1.JoinChallenge)
		reason string
	}{
		{
			name: "an EK certificate on a server without manufacturer roots", noVerifier: true,
			token:  &adminv1.CreateTokenRequest{Role: "gpu"},
			reason: "not pinned for any node, and its certificate is not trusted (no manufacturer roots are configured)",
		},
		{
			name: "an EK certificate no configured manufacturer root signed", otherRoots: true,
			token:  &adminv1.CreateTokenRequest{Role: "gpu"},
			reason: "not pinned for any node, and its certificate is not trusted (attest:",
		},
		{
			name:   "a TPM without an EK certificate and an EK no node has",
			token:  &adminv1.CreateTokenRequest{Role: "gpu"},
			round1: func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest) { req.Tpm.EkCertificate = nil },
			reason: "(the TPM has no EK certificate)",
		},
		{
			name:  "an AK certification of another key than the CSR's",
			token: &adminv1.CreateTokenRequest{Role: "gpu"},
			round1: func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest) {
				other, _, _ := m.newKey(t)
				att, sig, err := m.tp.Certify(t.Context(), m.ak, other, m.csrHash)
				if err != nil {
					t.Fatal(err)
				}
				req.Tpm.NodeKeyPublic, req.Tpm.CertifyAttest, req.Tpm.CertifySignature = other.PublicArea(), att, sig
			},
			reason: "the AK certified another key than the CSR's",
		},
		{
			name:  "an AK certification that does not verify",
			token: &adminv1.CreateTokenRequest{Role: "gpu"},
			round1: func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest) {
				req.Tpm.CertifySignature = []byte{0}
			},
			reason: "the AK's certification of the node key",
		},
		{
			name:  "an answer sent with another CSR",
			token: &adminv1.CreateTokenRequest{Role: "gpu"},
			round2: func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest, ch *joinv1.JoinChallenge) {
				_, req.Csr, _ = m.newKey(t)
			},
			reason: "the answer is for another CSR than the challenge",
		},
		{
			name:  "an answer for another round",
			token: &adminv1.CreateTokenRequest{Role: "gpu"},
			round2: func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest, ch *joinv1.JoinChallenge) {
				req.Answer.Round = 2
			},
			reason: "no answer to challenge round 1",
		},
		{
			name:  "an answer after the challenge expired",
			token: &adminv1.CreateTokenRequest{Role: "gpu"},
			round2: func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest, ch *joinv1.JoinChallenge) {
				e.clock.Advance(time.Minute)
			},
			reason: "challenge round 1 expired at",
		},
		{
			name:  "an answer sent twice",
			token: &adminv1.CreateTokenRequest{Role: "gpu"},
			round2: func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest, ch *joinv1.JoinChallenge) {
				if _, err := e.join.Join(t.Context(), req); err != nil {
					t.Fatalf("the first answer: %v", err)
				}
			},
			// The second answer finds no challenge; its token, spent by
			// the first, is what refuses it.
			reason: "token already used by node",
		},
		{
			name:   "an unknown EK without a token",
			token:  nil,
			round2: func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest, ch *joinv1.JoinChallenge) {},
			reason: "belongs to no node, and the join carries no token",
		},
		{
			name:  "a wrong activated secret in each of the three rounds",
			token: &adminv1.CreateTokenRequest{Role: "gpu"},
			round2: func(t *testing.T, e *env, m *tpmMachine, req *joinv1.JoinRequest, ch *joinv1.JoinChallenge) {
				// Rounds 1 and 2 fail and get a fresh challenge; round 3
				// is the last.
				for round := uint32(1); round <= 2; round++ {
					req.Answer.ActivatedSecret = []byte("wrong")
					resp, err := e.join.Join(t.Context(), req)
					next := resp.GetChallenge()
					if err != nil || next == nil || next.Round != round+1 {
						t.Fatalf("wrong answer in round %d: %v %v, want challenge round %d", round, resp, err, round+1)
					}
					req.DeferralId, req.Answer = next.DeferralId, m.answer(t, next)
				}
				req.Answer.ActivatedSecret = []byte("wrong")
			},
			reason: "challenge round 3 failed, the last",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, roots := newTPMMachine(t)
			switch {
			case tc.noVerifier:
				roots = nil
			case tc.otherRoots:
				roots = x509.NewCertPool()
			}
			e := tpmEnv(t, roots)
			secret, tokID := "", ""
			if tc.token != nil {
				secret, tokID = e.token(t, tc.token)
			}
			req := m.request(t, e, secret)
			if tc.round1 != nil {
				tc.round1(t, e, m, req)
			}
			if tc.round2 != nil {
				ch := challenge(t, e, req)
				req.DeferralId, req.Answer = ch.DeferralId, m.answer(t, ch)
				tc.round2(t, e, m, req, ch)
			}
			_, err := e.join.Join(t.Context(), req)
			// Only a refusal that comes after the token opened is audited.
			audited := ""
			if strings.Contains(tc.reason, "token already used") {
				audited = tokID
			}
			wantRefused(t, e, err, tc.reason, audited)
			if ids := e.nodes(t); len(ids) != 0 && tc.name != "an answer sent twice" {
				t.Errorf("nodes %v after a refused join", ids)
			}
		})
	}
}

func TestSimTPMJoinStoreFailure(t *testing.T) {
	m, roots := newTPMMachine(t)
	e := tpmEnv(t, roots)
	secret, _ := e.token(t, &adminv1.CreateTokenRequest{Role: "gpu"})
	e.store.FailNext("NodeByEKPin", storefault.ErrInjected)
	_, err := e.join.Join(t.Context(), m.request(t, e, secret))
	wantStatus(t, err, codes.Unavailable, "join could not be completed; retry later")
	e.wantFired(t)
	if ids := e.nodes(t); len(ids) != 0 {
		t.Errorf("nodes %v", ids)
	}
}

// TestSimTPMJoinRequiresEKCertificateAndPin: with
// tpm.require_ek_certificate_and_pin, a trusted EK certificate and a known
// EK (here bound by a declaration) are each refused alone; both pass round 1.
func TestSimTPMJoinRequiresEKCertificateAndPin(t *testing.T) {
	m, roots := newTPMMachine(t)
	ekPin, err := attest.EKPin(m.ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name              string
		trusted, declared bool
		reason            string // "" means round 1 passes
	}{
		{name: "a trusted certificate of an EK nobody knows", trusted: true,
			reason: "tpm.require_ek_certificate_and_pin wants the EK pinned for a node or bound by a declaration as well"},
		{name: "a declared EK whose certificate no configured root signed", declared: true,
			reason: "its certificate is not trusted"},
		{name: "a declared EK with a trusted certificate", trusted: true, declared: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool := x509.NewCertPool()
			if tc.trusted {
				pool = roots
			}
			v, err := attest.New(attest.Config{Roots: pool})
			if err != nil {
				t.Fatal(err)
			}
			e := newEnv(t, func(c *service.Config) { c.EKVerifier, c.RequireEKCertificateAndPin = v, true })
			if tc.declared {
				d := store.Declaration{Name: "gpu-1", Class: "worker", ProductUUID: "00000000-0000-4000-8000-0000000000aa", EKPins: []string{ekPin}, EKSource: "receiving-scan"}
				if err := e.db.ApplyInventory(t.Context(), store.InventoryWrite{Writes: []store.DeclarationWrite{{Declaration: d}}}); err != nil {
					t.Fatal(err)
				}
			}
			secret, _ := e.token(t, &adminv1.CreateTokenRequest{Role: "gpu"})
			req := m.request(t, e, secret)
			if tc.reason == "" {
				challenge(t, e, req)
				return
			}
			_, err = e.join.Join(t.Context(), req)
			wantRefused(t, e, err, tc.reason, "")
		})
	}
}
