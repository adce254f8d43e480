//go:build tpmsim

package service_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// policiesAt loads permissive policies for the default classes whose
// verdicts are stamped by now.
func policiesAt(t *testing.T, now func() time.Time) *bootpolicy.Policies {
	t.Helper()
	dir := t.TempDir()
	for _, class := range []string{"worker", "control-plane", "install-environment"} {
		if err := os.WriteFile(filepath.Join(dir, class+".toml"), []byte("class = \""+class+"\"\nsecure_boot = false\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestSimStaleBootChecksAlertAndKeepState(t *testing.T) {
	b := newBootEnv(t, func(c *service.Config) {
		c.BootPolicy, c.StaleAfter = policiesAt(t, c.Now), 2*time.Hour
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := b.session(t, ctx)
	pass := func() {
		t.Helper()
		resp, err := b.check(t, st, func(n []byte) *gatewayv1.SessionRequest { return evidenceMsg(b.evidence(t, n, nil)) })
		if err != nil || !resp.Verdict.Passed {
			t.Fatalf("CheckNode = %v, %v", resp, err)
		}
		result(t, st)
	}
	sweep := func() service.StaleSweep {
		t.Helper()
		sw, err := b.srv.SweepStale(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return sw
	}
	const overdue = "a node's boot check is overdue: not evidence, its state is unchanged; check its bcd and its session (fleetd nodes show, fleetd nodes check)"
	const idle = "ALERT: the control plane stored no boot verdict for longer than stale_after while nodes with a live TPM identity exist: check that nodes reach fleetd and that boot checks run"

	pass()
	if sw := sweep(); sw.Live != 1 || len(sw.Stale) != 0 || sw.Idle {
		t.Fatalf("sweep after a check: %+v", sw)
	}
	if got := b.metric(t, "nodetrust_boot_stale_nodes "); got != "nodetrust_boot_stale_nodes 0" {
		t.Errorf("stale gauge %q", got)
	}
	// The node's boot checks stop arriving.
	b.clock.Advance(2*time.Hour + time.Minute)
	for range 2 {
		if sw := sweep(); len(sw.Stale) != 1 || sw.Stale[0] != b.n.id || !sw.Idle {
			t.Fatalf("sweep with the check overdue: %+v", sw)
		}
	}
	if got := b.metric(t, "nodetrust_boot_stale_nodes "); got != "nodetrust_boot_stale_nodes 1" {
		t.Errorf("stale gauge %q", got)
	}
	if got := b.metric(t, "nodetrust_boot_verifier_idle "); got != "nodetrust_boot_verifier_idle 1" {
		t.Errorf("idle gauge %q", got)
	}
	if n := len(b.logs.find(overdue, "node_id", b.n.id)); n != 1 {
		t.Errorf("%d overdue log lines over two sweeps, want 1", n)
	}
	if n := len(b.logs.find(idle, "live_nodes", "1")); n != 1 {
		t.Errorf("%d control-plane idle alerts over two sweeps, want 1", n)
	}
	if got := b.storedNode(t, b.n.id).State; got != store.StateActive {
		t.Errorf("a stale node's state is %s, want active", got)
	}
	if h := b.audit(t, "node.quarantine"); len(h) != 0 {
		t.Errorf("quarantine audit %v", h)
	}
	// Its check arrives again.
	pass()
	if sw := sweep(); len(sw.Stale) != 0 || sw.Idle {
		t.Fatalf("sweep after the check resumed: %+v", sw)
	}
	if got := b.metric(t, "nodetrust_boot_stale_nodes "); got != "nodetrust_boot_stale_nodes 0" {
		t.Errorf("stale gauge %q", got)
	}
	if n := len(b.logs.find("a stale node's boot check arrived (or it no longer holds a live TPM identity)", "node_id", b.n.id)); n != 1 {
		t.Errorf("%d resumed lines, want 1", n)
	}
}
