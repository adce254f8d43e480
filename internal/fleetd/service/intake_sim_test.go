//go:build tpmsim

package service_test

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
	"github.com/nodetrust/nodetrust/tpm/tpmsim"
)

// Intake (seed 003, "Attestation and admission") against the in-process
// simulator: the machine's TPM side is made here with package tpm, the
// declarations are written as a declarer's, as fleetd inventory apply does.

const intakeUUID = "00000000-0000-4000-8000-0000000000aa"

// declareAs writes d as the declarer (or another role) named by, with its
// changelog, as fleetd inventory apply does.
func declareAs(t *testing.T, e *env, role roles.Role, d store.Declaration) {
	t.Helper()
	p := inventory.MakePlan(nil, nil, []store.Declaration{d}, inventory.Writer{Name: "alice", Role: role}, e.clock.Now(), "req", nil)
	if err := e.db.ApplyInventory(t.Context(), store.InventoryWrite{Writes: p.Writes, Changes: p.Changes}); err != nil {
		t.Fatal(err)
	}
}

func installDecl(pins ...string) store.Declaration {
	return store.Declaration{Name: "web-01", Serial: "SN-web-01", ProductUUID: intakeUUID, Class: "worker",
		EKPins: pins, EKSource: inventory.SourceReceivingScan}
}

// intakeRequest is m's first intake request: its node key is the device
// key, certified by its AK over sha256(csr).
func (m *tpmMachine) intakeRequest(t *testing.T) *joinv1.IntakeRequest {
	t.Helper()
	jr := m.request(t, nil, "")
	return &joinv1.IntakeRequest{Csr: jr.Csr, Tpm: jr.Tpm, Claims: &joinv1.HardwareClaims{ProductUuid: intakeUUID, Hostname: "hookos"}}
}

// intake runs both rounds of m's intake and returns the result, or the
// error of the round that failed.
func intake(t *testing.T, e *env, m *tpmMachine) (*joinv1.IntakeResult, error) {
	t.Helper()
	req := m.intakeRequest(t)
	resp, err := e.join.Intake(t.Context(), req)
	if err != nil {
		return nil, err
	}
	ch := resp.GetChallenge()
	if ch == nil || ch.DeferralId == "" {
		t.Fatalf("intake round 1 answered %v, want a challenge", resp)
	}
	req.DeferralId, req.Answer = ch.DeferralId, m.answer(t, ch)
	resp, err = e.join.Intake(t.Context(), req)
	if err != nil {
		return nil, err
	}
	if resp.GetIssued() == nil {
		t.Fatalf("intake round 2 answered %v, want the certificates", resp)
	}
	res, err := joinresponse.OpenIntake(resp.GetIssued(), e.bundle.JoinSigningKeyPin, sha256Of(req.Csr))
	if err != nil {
		t.Fatalf("the signed intake result: %v", err)
	}
	return res, nil
}

// wantIntakeRefused checks err is the wire's intake refusal and that the
// server logged reason.
func wantIntakeRefused(t *testing.T, e *env, err error, reason string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.PermissionDenied || !strings.HasPrefix(st.Message(), service.IntakeRefused+": ") ||
		!strings.Contains(st.Message(), "bcd intake again") {
		t.Fatalf("error %v, want PERMISSION_DENIED %q with what to do", err, service.IntakeRefused)
	}
	if strings.Contains(st.Message(), reason) {
		t.Errorf("the wire names the reason %q: %q", reason, st.Message())
	}
	if len(e.logs.find("intake refused", "reason", reason)) == 0 {
		t.Errorf("no intake refusal in the log names the reason %q", reason)
	}
}

func parseChain(t *testing.T, ders [][]byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for _, d := range ders {
		c, err := x509.ParseCertificate(d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func TestSimIntakeIssuesLDevIDAndLAKUnderTheDevIDCA(t *testing.T) {
	m, roots := newTPMMachine(t)
	e := tpmEnv(t, roots)
	ekPin, err := attest.EKPin(m.ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	declareAs(t, e, roles.Declarer, installDecl(ekPin))

	res, err := intake(t, e, m)
	if err != nil {
		t.Fatalf("intake of a declared machine: %v", err)
	}
	ldevid, lak := parseChain(t, res.LdevidChain), parseChain(t, res.LakChain)
	rootPool := x509.NewCertPool()
	for _, r := range parseChain(t, res.Roots) {
		rootPool.AddCert(r)
	}
	now := e.clock.Now()
	for name, chain := range map[string][]*x509.Certificate{"LDevID": ldevid, "LAK": lak} {
		inter := x509.NewCertPool()
		for _, c := range chain[1:] {
			inter.AddCert(c)
		}
		chains, err := chain[0].Verify(x509.VerifyOptions{Roots: rootPool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		if err != nil {
			t.Fatalf("the %s does not chain to the root: %v", name, err)
		}
		if !chains[0][1].Equal(e.auth.DevIDCA) {
			t.Errorf("the %s chains through %q, want the DevID CA", name, chains[0][1].Subject.CommonName)
		}
		nodeCA := x509.NewCertPool()
		nodeCA.AddCert(e.auth.NodeCA)
		if _, err := chain[0].Verify(x509.VerifyOptions{Roots: nodeCA, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
			t.Errorf("the %s verifies under the node CA", name)
		}
		info, err := pki.ParseDeviceCert(chain[0])
		if err != nil {
			t.Fatal(err)
		}
		if info.Device != "web-01" || info.Serial != "SN-web-01" || info.ProductUUID != intakeUUID || string(info.TPMAKName) != string(m.ak.Name()) {
			t.Errorf("the %s says %+v", name, info)
		}
		if chain[0].NotAfter.After(now.Add(service.DefaultIntakeWindow)) {
			t.Errorf("the %s lasts until %s, past the install window", name, chain[0].NotAfter)
		}
	}
	if !samePub(ldevid[0].PublicKey, m.key.Public()) {
		t.Error("the LDevID does not certify the device key")
	}
	if !samePub(lak[0].PublicKey, m.ak.Public()) {
		t.Error("the LAK certificate does not certify the AK")
	}
	if res.Device != "web-01" {
		t.Errorf("device %q", res.Device)
	}

	sess, err := e.srv.IntakeSession(t.Context(), res.SessionId)
	if err != nil {
		t.Fatalf("the intake session: %v", err)
	}
	if sess.Device != "web-01" || sess.EKPin != ekPin || string(sess.AKName) != string(m.ak.Name()) ||
		string(sess.EKPublic) != string(m.ek.PublicArea) || sess.LDevIDSerial != ldevid[0].SerialNumber.String() ||
		sess.ExpiresAt.UnixNano() != res.SessionNotAfterUnixNano {
		t.Errorf("stored session %+v", sess)
	}
	if a := e.audit(t, "intake"); len(a) != 1 || a[0].Subject != "web-01" || !strings.Contains(a[0].Detail, ekPin) {
		t.Errorf("intake audit %+v", a)
	}
	if got := e.metric(t, "nodetrust_intake_requests_total"); !strings.Contains(got, `outcome="challenge"} 1`) || !strings.Contains(got, `outcome="issued"} 1`) {
		t.Errorf("intake metrics:\n%s", got)
	}

	t.Run("an intake round is not a join's", func(t *testing.T) {
		req := m.intakeRequest(t)
		resp, err := e.join.Intake(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		ch := resp.GetChallenge()
		jr := m.request(t, e, "")
		jr.DeferralId, jr.Answer = ch.DeferralId, m.answer(t, ch)
		_, err = e.join.Join(t.Context(), jr)
		wantRefused(t, e, err, "a round of an intake", "")
	})

	t.Run("a stale intake session is refused for a later step", func(t *testing.T) {
		e.clock.Advance(service.DefaultIntakeWindow)
		_, err := e.srv.IntakeSession(t.Context(), res.SessionId)
		if !errors.Is(err, service.ErrIntakeSessionEnded) {
			t.Fatalf("an ended session: %v, want ErrIntakeSessionEnded", err)
		}
		if _, err := e.srv.IntakeSession(t.Context(), "no-such-session"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("an unknown session: %v, want ErrNotFound", err)
		}
	})
}

func samePub(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

func TestSimIntakeRefusesAnEKTheBindingDoesNotName(t *testing.T) {
	m, roots := newTPMMachine(t)
	// The EK certificate is trusted; the declaration the claims select
	// binds another EK (a copied serial).
	e := tpmEnv(t, roots)
	declareAs(t, e, roles.Declarer, installDecl("sha256:"+strings.Repeat("ab", 32)))
	_, err := intake(t, e, m)
	wantIntakeRefused(t, e, err, "whose binding names other EKs")
	if got := e.metric(t, "nodetrust_intake_requests_total"); !strings.Contains(got, `outcome="refused_not_admitted"} 1`) {
		t.Errorf("intake metrics:\n%s", got)
	}
	if a := e.audit(t, "intake.refused"); len(a) != 1 || !strings.Contains(a[0].Detail, "other EKs") {
		t.Errorf("refusal audit %+v", a)
	}
	if a := e.audit(t, "intake"); len(a) != 0 {
		t.Errorf("an intake was audited: %+v", a)
	}
}

func TestSimIntakeRefusesABindingNotWrittenByADeclarer(t *testing.T) {
	m, _ := newTPMMachine(t)
	e := tpmEnv(t, nil)
	ekPin, err := attest.EKPin(m.ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	declareAs(t, e, roles.Operator, installDecl(ekPin))
	_, err = intake(t, e, m)
	wantIntakeRefused(t, e, err, "not by a declarer")
}

func TestSimIntakeRefusesAnUndeclaredMachine(t *testing.T) {
	m, _ := newTPMMachine(t)
	e := tpmEnv(t, nil)
	_, err := intake(t, e, m)
	wantIntakeRefused(t, e, err, "no declaration binds it")
}

// TestSimIntakeRefusesADeviceKeyThatCanLeaveTheTPM has a real AK of the
// simulator certify a real TPM key made without fixedTPM and fixedParent:
// the certification is genuine, the key is not a device key.
func TestSimIntakeRefusesADeviceKeyThatCanLeaveTheTPM(t *testing.T) {
	tr, err := tpmsim.OpenTransport()
	if err != nil {
		t.Fatal(err)
	}
	tp := tpm.New(tr, tr)
	t.Cleanup(func() { _ = tp.Close() })
	ek, err := tp.EK(t.Context(), tpm.EKRSA2048)
	if err != nil {
		t.Fatal(err)
	}
	ekPin, err := attest.EKPin(ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	e := tpmEnv(t, nil)
	declareAs(t, e, roles.Declarer, installDecl(ekPin))

	attrs := tpmpub.NodeKeyAttributes
	attrs.FixedTPM, attrs.FixedParent = false, false
	akPub, keyPub, att, sig, csr := certifyRawKey(t, tr, tpmpub.ECCSigningTemplate(attrs, nil))
	req := &joinv1.IntakeRequest{Csr: csr, Claims: &joinv1.HardwareClaims{ProductUuid: intakeUUID},
		Tpm: &joinv1.TpmEvidence{EkPublic: ek.PublicArea, AkPublic: akPub, NodeKeyPublic: keyPub, CertifyAttest: att, CertifySignature: sig}}
	_, err = e.join.Intake(t.Context(), req)
	wantIntakeRefused(t, e, err, "the AK's certification of the device key")
	if len(e.logs.find("intake refused", "reason", "attributes")) == 0 {
		t.Error("the refusal does not name the key's attributes")
	}
}

// certifyRawKey makes, with raw TPM commands, an AK and a key of tmpl
// under a fresh storage key, has the AK certify the key over the SHA-256
// of a CSR of another (software) key, flushes everything, and returns the
// public areas, the certification and that CSR.
func certifyRawKey(t *testing.T, tr transport.TPM, tmpl tpm2.TPMTPublic) (akPub, keyPub, att, sig, csr []byte) {
	t.Helper()
	srk, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHOwner, InPublic: tpm2.New2B(tpm2.ECCSRKTemplate)}.Execute(tr)
	if err != nil {
		t.Fatal(err)
	}
	parent := tpm2.AuthHandle{Handle: srk.ObjectHandle, Name: srk.Name, Auth: tpm2.PasswordAuth(nil)}
	load := func(pub tpm2.TPMTPublic) (tpm2.AuthHandle, []byte) {
		c, err := tpm2.Create{ParentHandle: parent, InPublic: tpm2.New2B(pub)}.Execute(tr)
		if err != nil {
			t.Fatal(err)
		}
		l, err := tpm2.Load{ParentHandle: parent, InPrivate: c.OutPrivate, InPublic: c.OutPublic}.Execute(tr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = tpm2.FlushContext{FlushHandle: l.ObjectHandle}.Execute(tr) })
		area, err := c.OutPublic.Contents()
		if err != nil {
			t.Fatal(err)
		}
		return tpm2.AuthHandle{Handle: l.ObjectHandle, Name: l.Name, Auth: tpm2.PasswordAuth(nil)}, tpm2.Marshal(area)
	}
	ak, akPub := load(tpmpub.AKTemplate(nil))
	key, keyPub := load(tmpl)
	if _, err := (tpm2.FlushContext{FlushHandle: srk.ObjectHandle}).Execute(tr); err != nil {
		t.Fatal(err)
	}
	soft, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err = pki.CreateCSR(soft)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(csr)
	rsp, err := tpm2.Certify{ObjectHandle: key, SignHandle: ak, QualifyingData: tpm2.TPM2BData{Buffer: h[:]},
		InScheme: tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull}}.Execute(tr)
	if err != nil {
		t.Fatal(err)
	}
	return akPub, keyPub, rsp.CertifyInfo.Bytes(), tpm2.Marshal(rsp.Signature), csr
}

// The boot at intake is judged by the install environment class's policy,
// whatever class the device is declared with (a worker here).
func TestSimIntakeIsJudgedByTheInstallEnvironmentsPolicy(t *testing.T) {
	for _, tc := range []struct {
		name        string
		secureBoot  string // the class whose policy requires Secure Boot
		intakeClass string
		refused     bool
	}{
		{"the install environment's policy refuses", "install-environment", "", true},
		{"the declared class's policy does not apply", "worker", "", false},
		{"a configured intake class's policy applies", "worker", "worker", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, roots := newTPMMachine(t)
			e := newEnv(t, func(c *service.Config) {
				c.EKVerifier = mustVerifier(t, roots)
				c.BootPolicy = permissivePolicies(t, tc.secureBoot)
				c.IntakeClass = tc.intakeClass
			})
			ekPin, err := attest.EKPin(m.ek.Public)
			if err != nil {
				t.Fatal(err)
			}
			declareAs(t, e, roles.Declarer, installDecl(ekPin))
			_, err = intake(t, e, m)
			vs, verr := e.db.ListVerdicts(t.Context(), "web-01", 10)
			wantClass := "install-environment"
			if tc.intakeClass != "" {
				wantClass = tc.intakeClass
			}
			if verr != nil || len(vs) != 1 || vs[0].Stage != "intake" || vs[0].Class != wantClass || vs[0].Passed == tc.refused {
				t.Errorf("verdicts of web-01: %+v, %v; want one intake verdict of class %s", vs, verr, wantClass)
			}
			if !tc.refused {
				if err != nil {
					t.Fatalf("intake: %v", err)
				}
				return
			}
			wantIntakeRefused(t, e, err, "secure_boot: required")
			if a := e.audit(t, "intake.refused"); len(a) != 1 || a[0].Subject != "web-01" || !strings.Contains(a[0].Detail, "boot policy") {
				t.Errorf("refusal audit %+v", a)
			}
			if a := e.audit(t, "intake"); len(a) != 0 {
				t.Errorf("a refused intake was audited as passed: %+v", a)
			}
		})
	}
}

func sha256Of(b []byte) []byte {
	h := sha256.Sum256(b)
	return h[:]
}
