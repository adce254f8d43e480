//go:build tpmsim

package service_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/pki/pkitest"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// Capture from a node's last verified evidence (fleetd policy capture
// --node) and policy status from the store, on the reference simulator:
// a golden machine measures a Secure Boot chain (shim and a kernel, both
// verified by a signing authority), joins by tpm with its log and answers
// a boot check; the policy written from the evidence fleetd kept accepts
// that boot and refuses a machine whose kernel differs, until a [next]
// state names the new kernel.

// signedBoot is a Secure Boot log of a machine whose platform key is pk:
// shim and kernel verified by signer.
func signedBoot(t *testing.T, pk, signer *pkitest.CA, shim, kernel []byte) *tpmtest.EventLog {
	t.Helper()
	l := &tpmtest.EventLog{}
	l.SecureBootVariables(true, []*x509.Certificate{pk.Cert}, []*x509.Certificate{pk.Cert}, []*x509.Certificate{signer.Cert}, nil)
	l.Separators(0, 1, 2, 3, 4, 5, 6, 7)
	l.Authority(signer.Cert)
	l.BootApplication(shim, `\EFI\BOOT\BOOTX64.EFI`)
	l.BootApplication(kernel, `\EFI\Linux\talos.efi`)
	return l
}

func sum(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// joinBooted joins machine m by tpm, sending log with its quote.
func joinBooted(t *testing.T, e *env, m *tpmMachine, secret string, log []byte) (*node, error) {
	t.Helper()
	req := m.request(t, e, secret)
	ch := challenge(t, e, req)
	req.DeferralId, req.Answer = ch.DeferralId, m.answer(t, ch)
	req.Answer.EventLog = log
	resp, err := e.join.Join(t.Context(), req)
	if err != nil {
		return nil, err
	}
	if resp.GetSigned() == nil {
		t.Fatalf("tpm join answer %v, want a certificate", resp)
	}
	o := e.open(t, resp.GetSigned(), m.csrHash, m.key.Public())
	return &node{id: o.Result.NodeId, gen: o.Result.IdentityGeneration, key: m.key, chain: o.Result.Chain, leaf: o}, nil
}

// policyDirWith writes permissive policies for the default classes and
// worker as the worker's, and loads them.
func policyDirWith(t *testing.T, worker []byte) *bootpolicy.Policies {
	t.Helper()
	dir := t.TempDir()
	for _, class := range []string{"control-plane", "install-environment"} {
		if err := os.WriteFile(filepath.Join(dir, class+".toml"), []byte("class = \""+class+"\"\nsecure_boot = false\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "worker.toml"), worker, 0o600); err != nil {
		t.Fatal(err)
	}
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// bootedEnv starts a server with policies ps and joins a simulator
// machine that measured boot, with a token; the join's error, if any.
func bootedEnv(t *testing.T, ps *bootpolicy.Policies, boot *tpmtest.EventLog) (*bootEnv, error) {
	t.Helper()
	m, roots := newBootedTPMMachine(t, boot)
	vlog, err := bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vlog.Close() })
	act, cordons := cordonReceiver(t)
	e := newEnv(t, func(c *service.Config) {
		c.EKVerifier = mustVerifier(t, roots)
		c.BootPolicy, c.VerdictLog, c.Actuator, c.BootCheckTimeout = ps, vlog, act, 2*time.Second
	})
	secret, _ := e.token(t, nil)
	n, err := joinBooted(t, e, m, secret, boot.Bytes())
	return &bootEnv{env: e, m: m, n: n, cordons: cordons, vlog: vlog}, err
}

// checkBooted runs a boot check of b's node answered with log, and
// returns the verdict.
func (b *bootEnv) checkBooted(t *testing.T, log []byte) *adminv1.Verdict {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := b.session(t, ctx)
	resp, err := b.check(t, st, func(n []byte) *gatewayv1.SessionRequest { return evidenceMsg(b.evidence(t, n, log)) })
	if err != nil {
		t.Fatalf("CheckNode: %v", err)
	}
	result(t, st)
	return resp.Verdict
}

func (b *bootEnv) policyStatus(t *testing.T) []*adminv1.PolicyClassStatus {
	t.Helper()
	r, err := b.admin.PolicyStatus(t.Context(), &adminv1.PolicyStatusRequest{})
	if err != nil {
		t.Fatalf("PolicyStatus: %v", err)
	}
	return r.Classes
}

func TestSimCaptureFromNodeEvidence(t *testing.T) {
	signer, pk := pkitest.NewCA(t, "Talos Secure Boot Signing"), pkitest.NewCA(t, "Test Platform Key")
	shim, kernel, newKernel := sum("shimx64.efi 15.8"), sum("talos v1.11.5 UKI"), sum("talos v1.12.0 UKI")
	golden := signedBoot(t, pk, signer, shim, kernel)
	var captured []byte

	t.Run("the golden machine's kept evidence captures a policy it passes", func(t *testing.T) {
		// A loose first policy: any boot the signer verified.
		loose := fmt.Sprintf("class = \"worker\"\nsecure_boot = false\n[[allowed_authorities]]\nname = \"Talos\"\nsha256 = \"%x\"\n", sha256.Sum256(signer.Cert.Raw))
		b, err := bootedEnv(t, policyDirWith(t, []byte(loose)), golden)
		if err != nil {
			t.Fatalf("the golden machine's join: %v", err)
		}
		r, err := b.admin.GetBootEvidence(t.Context(), &adminv1.GetBootEvidenceRequest{NodeId: b.n.id})
		if err != nil {
			t.Fatalf("GetBootEvidence after the join: %v", err)
		}
		ev := r.Evidence
		if ev.NodeId != b.n.id || ev.Stage != "intake" || !ev.Passed || ev.Class != "worker" || !bytes.Equal(ev.EventLog, golden.Bytes()) || len(ev.Pcrs) != 8 {
			t.Fatalf("the join's kept evidence: node %s stage %s class %s passed %t, %d log bytes, %d PCRs", ev.NodeId, ev.Stage, ev.Class, ev.Passed, len(ev.EventLog), len(ev.Pcrs))
		}
		if v := b.checkBooted(t, golden.Bytes()); !v.Passed || v.Matched != bootpolicy.MatchedCurrent {
			t.Fatalf("boot check verdict %v, want a pass that matched current", v)
		}
		if r, err = b.admin.GetBootEvidence(t.Context(), &adminv1.GetBootEvidenceRequest{NodeId: b.n.id}); err != nil || r.Evidence.Stage != "boot-check" {
			t.Fatalf("after a boot check, the kept evidence is of stage %q, %v; want boot-check (the latest)", r.GetEvidence().GetStage(), err)
		}
		ev = r.Evidence
		for i, want := range golden.PCRs() {
			if !bytes.Equal(ev.Pcrs[uint32(i)], want) {
				t.Fatalf("kept PCR %d is %x, the log's replay %x", i, ev.Pcrs[uint32(i)], want)
			}
		}
		pcrs := map[int][]byte{}
		for i, v := range ev.Pcrs {
			pcrs[int(i)] = v
		}
		quote := &bootpolicy.Quote{AKPublic: ev.AkPublic, Attest: ev.QuoteAttest, Signature: ev.QuoteSignature, Nonce: ev.Nonce}
		content, v, err := bootpolicy.Capture(bootpolicy.CaptureOptions{Class: "worker", EventLog: ev.EventLog, PCRs: pcrs, Quote: quote,
			Source: "node " + b.n.id + "'s last verified boot evidence"})
		if err != nil {
			t.Fatalf("capture from the kept evidence: %v", err)
		}
		if !v.Pass() || !v.QuoteVerified {
			t.Fatalf("the capture's check: failed %v, quote verified %t", v.Failed, v.QuoteVerified)
		}
		for _, want := range []string{"secure_boot = true", fmt.Sprintf("%x", shim), fmt.Sprintf("%x", kernel), "Talos-Secure-Boot-Signing"} {
			if !strings.Contains(string(content), want) {
				t.Errorf("the captured policy does not say %q:\n%s", want, content)
			}
		}
		// Evidence altered after the quote does not capture: the quote
		// is verified again.
		forged := map[int][]byte{}
		for i, v := range pcrs {
			forged[i] = v
		}
		forged[0] = make([]byte, 32)
		if _, _, err := bootpolicy.Capture(bootpolicy.CaptureOptions{Class: "worker", EventLog: ev.EventLog, PCRs: forged, Quote: quote}); err == nil {
			t.Error("a capture from PCR values the quote does not cover succeeded")
		}
		if _, err := b.admin.GetBootEvidence(t.Context(), &adminv1.GetBootEvidenceRequest{NodeId: "no-such-node"}); err == nil {
			t.Error("GetBootEvidence of an unknown node succeeded")
		} else {
			wantStatus(t, err, codes.NotFound, "no boot evidence of node no-such-node is kept")
		}
		captured = content
	})
	if captured == nil {
		t.FailNow()
	}

	t.Run("under the captured policy the golden boot passes, a machine with another kernel is refused", func(t *testing.T) {
		b, err := bootedEnv(t, policyDirWith(t, captured), golden)
		if err != nil {
			t.Fatalf("a machine with the golden boot, under the captured policy: %v", err)
		}
		if v := b.checkBooted(t, golden.Bytes()); !v.Passed {
			t.Errorf("its boot check failed: %v", v.Failed)
		}
	})
	t.Run("a machine whose kernel differs fails the captured policy", func(t *testing.T) {
		other := signedBoot(t, pk, signer, shim, newKernel)
		b, err := bootedEnv(t, policyDirWith(t, captured), other)
		if err == nil {
			t.Fatal("a machine with another kernel joined under the captured policy")
		}
		wantStatus(t, err, codes.PermissionDenied, "Join refused")
		refusals := b.audit(t, "join.boot_refused")
		if len(refusals) != 1 || !strings.Contains(refusals[0].Detail, "boot_applications: not pinned") {
			t.Fatalf("refusal audit %+v, want boot_applications", refusals)
		}
		for _, r := range []string{"secure_boot", "allowed_authorities", "pcr_values"} {
			if strings.Contains(refusals[0].Detail, r+":") {
				t.Errorf("the refusal also names %s: %s", r, refusals[0].Detail)
			}
		}
	})
	t.Run("with a next state for the new kernel, its boot matches next and policy status counts it", func(t *testing.T) {
		now := time.Now().UTC()
		withNext := string(captured) + fmt.Sprintf("\n[next]\nnot_before = %s\nnot_after = %s\n[[next.boot_applications]]\nname = \"shim\"\nsha256 = \"%x\"\n[[next.boot_applications]]\nname = \"talos v1.12.0\"\nsha256 = \"%x\"\n",
			now.Add(-time.Hour).Format(time.RFC3339), now.Add(time.Hour).Format(time.RFC3339), shim, newKernel)
		other := signedBoot(t, pk, signer, shim, newKernel)
		b, err := bootedEnv(t, policyDirWith(t, []byte(withNext)), other)
		if err != nil {
			t.Fatalf("a machine with the next kernel, inside the window: %v", err)
		}
		if st := b.policyStatus(t); len(st) != 0 {
			t.Errorf("policy status before any stored verdict of the node: %v", st)
		}
		if v := b.checkBooted(t, other.Bytes()); !v.Passed || v.Matched != bootpolicy.MatchedNext {
			t.Fatalf("boot check verdict %v, want a pass that matched next", v)
		}
		if vs := b.verdicts(t); len(vs) != 1 || vs[0].Matched != bootpolicy.MatchedNext {
			t.Errorf("stored verdicts %v, want one that matched next", vs)
		}
		st := b.policyStatus(t)
		if len(st) != 1 || st[0].Class != "worker" || st[0].Nodes != 1 || st[0].Next != 1 || st[0].Current != 0 || st[0].Failing != 0 {
			t.Fatalf("policy status %v, want worker: 1 node on next", st)
		}
		if v := b.checkBooted(t, falseLog()); v.Passed {
			t.Fatal("a false log passed")
		}
		if st := b.policyStatus(t); len(st) != 1 || st[0].Failing != 1 || st[0].Next != 0 {
			t.Fatalf("policy status after a failed check %v, want worker: 1 failing", st)
		}
	})
}
