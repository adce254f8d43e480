//go:build tpmsim

package service_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/export"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/spireexport"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Audit mode and the graded response of enforced policies
// (docs/boot-policy.md, "Audit mode and graded response").

// workerPolicies writes permissive policies for the default classes, the
// worker's with top (top-level keys) and rest (tables) added, and loads
// them.
func workerPolicies(t *testing.T, top, rest string) *bootpolicy.Policies {
	t.Helper()
	dir := t.TempDir()
	for _, class := range []string{"worker", "control-plane", "install-environment"} {
		body := "class = \"" + class + "\"\n"
		if class == "worker" {
			body += top + "\n" + rest + "\n"
		} else {
			body += "secure_boot = false\n"
		}
		if err := os.WriteFile(filepath.Join(dir, class+".toml"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// result reads the boot-check result the session sends the node after its
// evidence, and returns its detail (what fleetd did).
func result(t *testing.T, st gatewayv1.Gateway_SessionClient) string {
	t.Helper()
	m, err := st.Recv()
	if err != nil || m.GetBootResult() == nil {
		t.Fatalf("the session got %v, %v; want a boot result", m, err)
	}
	return m.GetBootResult().Detail
}

const secureBootRequired = "secure_boot = true\n\n[[allowed_authorities]]\nname = \"x\"\nsha256 = \"abababababababababababababababababababababababababababababababab\"\n"

func TestSimAuditModeRecordsAndNeverEnforces(t *testing.T) {
	// The worker's policy requires Secure Boot, which the simulator's
	// boot (an empty log) cannot show: every verdict fails, from the
	// join on. In audit mode none of them is enforced.
	b := newBootEnv(t, func(c *service.Config) {
		c.BootPolicy = workerPolicies(t, "mode = \"audit\"\n"+secureBootRequired, "")
	})
	if got := b.storedNode(t, b.n.id).State; got != store.StateActive {
		t.Fatalf("the join in audit mode left state %s, want active", got)
	}
	if got := b.metric(t, `nodetrust_boot_policy_mode{class="worker",mode="audit"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("mode gauge %q, want 1", got)
	}
	if got := b.metric(t, `nodetrust_boot_policy_mode{class="control-plane",mode="enforce"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("control-plane mode gauge %q, want enforce 1", got)
	}
	if len(b.logs.find("boot policy in audit mode: failures alert, nothing is enforced", "class", "worker")) != 1 {
		t.Error("the start does not say the worker policy is in audit mode")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := b.session(t, ctx)
	resp, err := b.check(t, st, func(n []byte) *gatewayv1.SessionRequest { return evidenceMsg(b.evidence(t, n, nil)) })
	if err != nil || resp.Action != "audited" || resp.Verdict.Passed || len(resp.Verdict.Failed) == 0 || resp.Verdict.Failed[0].Rule != "secure_boot" {
		t.Fatalf("CheckNode = %v, %v; want a failed verdict, audited", resp, err)
	}
	if got := result(t, st); got != "audited" {
		t.Errorf("the node was told %q", got)
	}
	if m := b.renewOnSession(t, st, true, nil); m.GetRenew().GetSigned() == nil {
		t.Fatalf("a renewal in audit mode was not issued: %v", m)
	}
	if vs := b.verdicts(t); len(vs) != 2 || vs[0].Passed || vs[1].Passed {
		t.Errorf("stored verdicts %v, want two failed", vs)
	}
	if got := b.storedNode(t, b.n.id).State; got != store.StateActive {
		t.Errorf("state %s, want active", got)
	}
	// The join, the check and the renewal each alerted.
	if got := b.metric(t, `nodetrust_boot_audit_failures_total{class="worker"}`); !strings.HasSuffix(got, " 3") {
		t.Errorf("audit failures %q, want 3", got)
	}
	if n := len(b.logs.find(`ALERT: a boot failed its policy in audit mode; nothing enforced: fix the machine or the policy before setting mode = "enforce"`, "reason", "secure_boot")); n != 3 {
		t.Errorf("%d audit alert lines, want 3", n)
	}
	if h := b.audit(t, "node.quarantine"); len(h) != 0 {
		t.Errorf("quarantine audit %v", h)
	}
	if len(b.cordons) != 0 {
		t.Error("audit mode requested a cordon")
	}
}

func TestSimGradedResponse(t *testing.T) {
	fail := func(b *bootEnv) func([]byte) *gatewayv1.SessionRequest {
		return func(n []byte) *gatewayv1.SessionRequest { return evidenceMsg(b.evidence(t, n, falseLog())) }
	}
	pass := func(b *bootEnv) func([]byte) *gatewayv1.SessionRequest {
		return func(n []byte) *gatewayv1.SessionRequest { return evidenceMsg(b.evidence(t, n, nil)) }
	}
	t.Run("failures below quarantine_after warn, a pass resets the count, the Nth in a row quarantines", func(t *testing.T) {
		b := newBootEnv(t, func(c *service.Config) {
			c.BootPolicy = workerPolicies(t, "secure_boot = false", "[response]\nquarantine_after = 3\ncritical = [\"pcr_values\"]")
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		st := b.session(t, ctx)
		for i, step := range []struct {
			answer     func(*bootEnv) func([]byte) *gatewayv1.SessionRequest
			wantAction string
		}{
			{fail, "warned"}, {fail, "warned"}, {pass, "none"},
			{fail, "warned"}, {fail, "warned"}, {fail, "quarantined"},
		} {
			resp, err := b.check(t, st, step.answer(b))
			if err != nil || resp.Action != step.wantAction {
				t.Fatalf("check %d: %v, %v; want action %s", i+1, resp, err, step.wantAction)
			}
			result(t, st)
			want := store.StateActive
			if step.wantAction == "quarantined" {
				want = store.StateQuarantined
			}
			if got := b.storedNode(t, b.n.id).State; got != want {
				t.Fatalf("check %d: state %s, want %s", i+1, got, want)
			}
		}
		if got := b.metric(t, `nodetrust_boot_warnings_total{class="worker"}`); !strings.HasSuffix(got, " 4") {
			t.Errorf("warnings %q, want 4", got)
		}
		if n := len(b.logs.find("boot verdict failed: a warning, no quarantine yet", "failures_in_a_row", "2")); n != 2 {
			t.Errorf("%d warnings at the second failure in a row, want 2 (the pass reset the count)", n)
		}
		if c := <-b.cordons; c.NodeID != b.n.id {
			t.Errorf("cordon %+v", c)
		}
		if h := b.audit(t, "node.quarantine"); len(h) != 1 {
			t.Errorf("quarantine audit %v", h)
		}
	})
	t.Run("a failed renewal below quarantine_after warns and is issued", func(t *testing.T) {
		b := newBootEnv(t, func(c *service.Config) {
			c.BootPolicy = workerPolicies(t, "secure_boot = false", "[response]\nquarantine_after = 2")
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		st := b.session(t, ctx)
		if m := b.renewOnSession(t, st, true, falseLog()); m.GetRenew().GetSigned() == nil {
			t.Fatalf("renewal answer %v, want issued with a warning", m)
		}
		if got := b.storedNode(t, b.n.id).State; got != store.StateActive {
			t.Errorf("state %s, want active", got)
		}
	})
	t.Run("a critical rule quarantines at once", func(t *testing.T) {
		b := newBootEnv(t, func(c *service.Config) {
			c.BootPolicy = workerPolicies(t, "secure_boot = false", "[response]\nquarantine_after = 3\ncritical = [\"event_log\"]")
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		st := b.session(t, ctx)
		resp, err := b.check(t, st, fail(b))
		if err != nil || resp.Action != "quarantined" {
			t.Fatalf("CheckNode = %v, %v; want quarantined", resp, err)
		}
		if got := b.storedNode(t, b.n.id).State; got != store.StateQuarantined {
			t.Errorf("state %s, want quarantined", got)
		}
		if got := b.metric(t, `nodetrust_boot_warnings_total`); got != "" {
			t.Errorf("warnings %q, want none", got)
		}
	})
	t.Run("quarantine_after above verdicts_kept refuses to start", func(t *testing.T) {
		e := newEnv(t)
		_, err := service.New(service.Config{Authority: e.auth, Store: e.db, VerdictsKept: 2,
			BootPolicy: workerPolicies(t, "secure_boot = false", "[response]\nquarantine_after = 3")})
		if err == nil || !strings.Contains(err.Error(), "raise [boot_policy] verdicts_kept") {
			t.Fatalf("New: %v", err)
		}
	})
}

// TestSimBootQuarantineWithdrawsFromTheExport: a worker quarantined by a
// failed boot check leaves the device export, and the SPIRE export's plan
// made from it deletes the node's fleet-owned entries (the step that
// withdraws its registrations; against a real SPIRE server the export
// tests in internal/integration apply such plans).
func TestSimBootQuarantineWithdrawsFromTheExport(t *testing.T) {
	b := newBootEnv(t)
	other := b.newNode(t, "web")
	docOf := func() export.Document {
		t.Helper()
		body, _, err := b.srv.ExportDocument(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		doc, _, err := export.Parse(body, b.auth.TrustDomain)
		if err != nil {
			t.Fatal(err)
		}
		return doc
	}
	before := docOf()
	if len(before.Devices) != 2 {
		t.Fatalf("export before the check lists %d devices, want 2", len(before.Devices))
	}
	var applied []spireexport.Entry
	for _, c := range spireexport.Desired(before) {
		applied = append(applied, c.Entry)
	}
	if p := spireexport.Diff(before, applied); !p.Empty() {
		t.Fatalf("the applied export plans changes: %s", p.Summary())
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := b.session(t, ctx)
	resp, err := b.check(t, st, func(n []byte) *gatewayv1.SessionRequest { return evidenceMsg(b.evidence(t, n, falseLog())) })
	if err != nil || resp.Action != "quarantined" {
		t.Fatalf("CheckNode = %v, %v; want quarantined", resp, err)
	}
	after := docOf()
	if len(after.Devices) != 1 || after.Devices[0].NodeID != other.id {
		t.Fatalf("export after the quarantine lists %+v, want %s alone", after.Devices, other.id)
	}
	p := spireexport.Diff(after, applied)
	if len(p.Withdrawn) != 1 || p.Withdrawn[0] != b.n.id || len(p.Delete) == 0 || len(p.Create) != 0 || len(p.Update) != 0 {
		t.Fatalf("plan after the quarantine: %s (withdrawn %v), want %s's entries deleted", p.Summary(), p.Withdrawn, b.n.id)
	}
	for _, d := range p.Delete {
		if d.NodeID != b.n.id {
			t.Errorf("the plan deletes %s's entry %s", d.NodeID, d.Entry.ID)
		}
	}
}
