//go:build tpmsim

package service_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
)

// Later joins and boot checks quoted by the LAK (docs/install.md): the
// machine's intake certifies its AK as the LAK; its tpm join after the
// install sends the LAK certificate, and fleetd keeps the LAK's name.

// lakJoin runs m's tpm join (no token: the worker auto-provisions) with
// chain as the LAK chain and returns the node, or the error of the round
// that failed.
func lakJoin(t *testing.T, e *env, m *tpmMachine, chain [][]byte) (*node, error) {
	t.Helper()
	req := m.request(t, e, "")
	req.Claims = &joinv1.HardwareClaims{ProductUuid: intakeUUID, Hostname: "web-01"}
	req.Tpm.LakChain = chain
	ch := challenge(t, e, req)
	req.DeferralId, req.Answer = ch.DeferralId, m.answer(t, ch)
	resp, err := e.join.Join(t.Context(), req)
	if err != nil {
		return nil, err
	}
	if resp.GetSigned() == nil {
		t.Fatalf("tpm join answered %v, want a signed result", resp)
	}
	o := e.open(t, resp.GetSigned(), m.csrHash, m.key.Public())
	return &node{id: o.Result.NodeId, gen: o.Result.IdentityGeneration, key: m.key, chain: o.Result.Chain, leaf: o}, nil
}

// wantJoinRefusedBy checks err is the wire's one join refusal and that the
// server logged a refusal naming rule.
func wantJoinRefusedBy(t *testing.T, e *env, err error, rule string) {
	t.Helper()
	wantStatus(t, err, codes.PermissionDenied, service.JoinRefused)
	if len(e.logs.find("join refused", "reason", "rule "+rule+":")) == 0 {
		t.Errorf("no join refusal in the log names rule %s", rule)
	}
}

// withAK is m with another AK of the same TPM, which certifies m's node
// key, until the returned func closes it (the simulator holds three
// objects, and a join's credential activation loads the EK).
func withAK(t *testing.T, m *tpmMachine) (*tpmMachine, func()) {
	t.Helper()
	ak, _, err := m.tp.NewAK(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	m2 := *m
	m2.ak = ak
	return &m2, func() { _ = ak.Close() }
}

// lakChainOf is a LAK certificate chain for m's AK, issued by iss for
// device; the chain is the leaf and iss's chain.
func lakChainOf(t *testing.T, e *env, iss *pki.Issuer, m *tpmMachine, device, serial string) [][]byte {
	t.Helper()
	now := e.clock.Now()
	c, err := iss.IssueDevice(pki.DeviceRequest{Kind: pki.LAK, PublicKey: m.ak.Public(), Device: device, Serial: serial,
		ProductUUID: intakeUUID, TPMAKName: m.ak.Name(), NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	out := [][]byte{c.Raw}
	for _, ca := range iss.Chain() {
		out = append(out, ca.Raw)
	}
	return out
}

func TestSimJoinAndBootChecksQuotedByTheLAK(t *testing.T) {
	m, roots := newTPMMachine(t)
	vlog, err := bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vlog.Close() })
	act, cordons := cordonReceiver(t)
	e := newEnv(t, func(c *service.Config) {
		c.EKVerifier = mustVerifier(t, roots)
		c.BootPolicy, c.VerdictLog, c.Actuator, c.BootCheckTimeout = permissivePolicies(t), vlog, act, 2*time.Second
		c.AutoProvision = true
		// Every refusal below is logged: the test reads the rule there.
		c.Limits.RefusalLogBurst = 100
	})
	ekPin, err := attest.EKPin(m.ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	// The LAK is an AK whose record is kept, so that it can be unloaded
	// while another AK of the TPM joins.
	_ = m.ak.Close()
	var lakRec tpm.KeyRecord
	if m.ak, lakRec, err = m.tp.NewAK(t.Context()); err != nil {
		t.Fatal(err)
	}
	reloadLAK := func() {
		if m.ak, err = m.tp.LoadAK(t.Context(), lakRec); err != nil {
			t.Fatal(err)
		}
	}
	declareAs(t, e, roles.Declarer, installDecl(ekPin))
	res, err := intake(t, e, m)
	if err != nil {
		t.Fatalf("intake: %v", err)
	}
	// Refusals first: none of them writes the node.
	t.Run("a LAK certificate of another device is refused", func(t *testing.T) {
		_, err := lakJoin(t, e, m, lakChainOf(t, e, e.auth.DevIDIssuer, m, "web-02", "SN-web-02"))
		wantJoinRefusedBy(t, e, err, service.RuleLAKDevice)
	})
	t.Run("a LAK certificate naming the device with another serial is refused", func(t *testing.T) {
		_, err := lakJoin(t, e, m, lakChainOf(t, e, e.auth.DevIDIssuer, m, "web-01", "SN-forged"))
		wantJoinRefusedBy(t, e, err, service.RuleLAKDevice)
	})
	t.Run("a LAK certificate not from the DevID CA is refused", func(t *testing.T) {
		// The node CA chains to the same root.
		_, err := lakJoin(t, e, m, lakChainOf(t, e, e.auth.Issuer, m, "web-01", "SN-web-01"))
		wantJoinRefusedBy(t, e, err, service.RuleLAKChain)
	})
	t.Run("a LAK certificate of another AK than the quoting one is refused", func(t *testing.T) {
		_ = m.ak.Close()
		defer reloadLAK()
		other, done := withAK(t, m)
		defer done()
		_, err := lakJoin(t, e, other, res.LakChain)
		wantJoinRefusedBy(t, e, err, service.RuleLAKAK)
	})
	t.Run("a LAK chain of more than four certificates is refused before any challenge", func(t *testing.T) {
		req := m.request(t, e, "")
		req.Tpm.LakChain = append(res.LakChain, res.LakChain[0], res.LakChain[0], res.LakChain[0])
		_, err := e.join.Join(t.Context(), req)
		wantJoinRefusedBy(t, e, err, service.RuleLAKChain)
	})
	if ns := e.nodes(t); len(ns) != 0 {
		t.Fatalf("refused joins wrote nodes %v", ns)
	}

	// The install's join with the LAK and its certificate.
	n, err := lakJoin(t, e, m, res.LakChain)
	if err != nil {
		t.Fatalf("join with the LAK: %v", err)
	}
	if n.id != "web-01" {
		t.Fatalf("joined as %s, want web-01", n.id)
	}
	if got := e.storedNode(t, n.id).LAKName; !bytes.Equal(got, m.ak.Name()) {
		t.Fatalf("the node record keeps LAK name %x, want %x", got, m.ak.Name())
	}

	b := &bootEnv{env: e, m: m, n: n, cordons: cordons, vlog: vlog}
	st := b.session(t, t.Context())
	r, err := b.check(t, st, func(nonce []byte) *gatewayv1.SessionRequest { return evidenceMsg(b.evidence(t, nonce, nil)) })
	if err != nil || r.Verdict == nil || !r.Verdict.Passed {
		t.Fatalf("a boot check quoted by the LAK: %v, %v; want a pass", r, err)
	}
	if msg, err := st.Recv(); err != nil || msg.GetBootResult().GetResult() != "pass" {
		t.Fatalf("the node was told %v, %v; want the pass", msg, err)
	}
	r, err = b.check(t, st, func(nonce []byte) *gatewayv1.SessionRequest {
		other, done := withAK(t, m)
		defer done()
		ob := &bootEnv{env: e, m: other, n: n}
		return evidenceMsg(ob.evidence(t, nonce, nil))
	})
	wantStatus(t, err, codes.Unavailable, "no boot evidence")
	if r != nil {
		t.Fatalf("a boot check quoted by another AK answered %v", r)
	}
	if got := e.metric(t, "nodetrust_boot_evidence_ignored_total"); !strings.Contains(got, `reason="wrong_ak"`) {
		t.Errorf("the quote by another AK is not counted as wrong_ak: %q", got)
	}

	// After the install, the node re-joins only with its LAK.
	t.Run("a re-join with another AK and no LAK certificate is refused", func(t *testing.T) {
		_ = m.ak.Close()
		defer reloadLAK()
		other, done := withAK(t, m)
		defer done()
		_, err := lakJoin(t, e, other, nil)
		wantJoinRefusedBy(t, e, err, service.RuleLAKSubstitute)
	})
	t.Run("a token re-join of the installed node is refused", func(t *testing.T) {
		secret, _ := e.token(t, nil)
		req := e.request(t, newMachine(t, "web-01"), secret)
		req.Claims.ProductUuid = intakeUUID
		_, err := e.join.Join(t.Context(), req)
		wantJoinRefusedBy(t, e, err, service.RuleLAKSubstitute)
	})
	if got := e.storedNode(t, n.id); got.Generation != n.gen || !bytes.Equal(got.LAKName, m.ak.Name()) {
		t.Fatalf("refused re-joins changed the node: generation %d (want %d), LAK %x", got.Generation, n.gen, got.LAKName)
	}
	t.Run("a re-join with the LAK after its certificate expired keeps the LAK", func(t *testing.T) {
		e.clock.Advance(service.DefaultIntakeWindow + time.Minute)
		_, err := lakJoin(t, e, m, res.LakChain)
		wantJoinRefusedBy(t, e, err, service.RuleLAKValidity)
		again, err := lakJoin(t, e, m, nil)
		if err != nil {
			t.Fatalf("re-join with the LAK and no certificate: %v", err)
		}
		if got := e.storedNode(t, n.id); got.Generation != again.gen || !bytes.Equal(got.LAKName, m.ak.Name()) {
			t.Fatalf("after the re-join: generation %d (want %d), LAK %x (want %x)", got.Generation, again.gen, got.LAKName, m.ak.Name())
		}
	})
}

// A node installed without intake keeps today's behaviour: no LAK name,
// any AK of its TPM.
func TestSimJoinWithoutIntakeKeepsNoLAK(t *testing.T) {
	m, roots := newTPMMachine(t)
	e := tpmEnv(t, roots)
	secret, _ := e.token(t, nil)
	n := tpmJoin(t, e, m, secret)
	if got := e.storedNode(t, n.id).LAKName; len(got) != 0 {
		t.Fatalf("a join without a LAK certificate recorded LAK %x", got)
	}
}
