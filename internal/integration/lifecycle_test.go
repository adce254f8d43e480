package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// One test per row of the table in docs/lifecycle.md, with the real
// binaries, token joins and tpm joins on swtpm.

const (
	uuid1 = "6a1f5c1e-0000-4000-8000-00000000a001"
	uuid2 = "6a1f5c1e-0000-4000-8000-00000000a002"
	uuid3 = "6a1f5c1e-0000-4000-8000-00000000a003"
)

// Row planned: a token authorizes a declared device's first installation;
// a TPM join needs a declarer-written binding and provisioning, which
// auto-provision gives a worker and never a control plane; a token does
// not stand in for a TPM the declaration binds.
func TestLifecyclePlanned(t *testing.T) {
	cp := startControlPlane(t, "[inventory]\nauto_provision = true\n")
	declarer := cp.credential(t, "alice", "declarer")
	swW, swC := tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t)
	cp.apply(t, declarer, inventoryFile(
		decl{"web-01", uuid1, "worker", ekPin(t, swW)},
		decl{"cp-01", uuid2, "control-plane", ekPin(t, swC)},
		decl{"db-01", uuid3, "worker", ""},
	))

	t.Run("a control plane is not auto-provisioned: its tpm join waits as a claim", func(t *testing.T) {
		m := tpmMachine(t, cp, uuid2, swC, "")
		refusedFor(t, cp, "cp-01 is planned and not provisioned", func() result { return tpmJoin(t, m, "", false) })
		claims := cp.mustFleetd(t, "", "claims", "list").stdout
		if !strings.Contains(claims, "cp-01") || !strings.Contains(claims, "not provisioned") {
			t.Errorf("claims list:\n%s", claims)
		}
	})
	t.Run("a token does not stand in for the TPM a declaration binds", func(t *testing.T) {
		refusedFor(t, cp, "joins only with its TPM", func() result { return tokenJoin(t, cp, newMachine(t, cp, uuid2, ""), false) })
	})
	t.Run("a worker's first tpm join is auto-provisioned", func(t *testing.T) {
		node := joinedAs(t, tpmJoin(t, tpmMachine(t, cp, uuid1, swW, ""), "", false))
		if node != "web-01" {
			t.Fatalf("joined as %s, want web-01", node)
		}
		h := cp.history(t, "web-01")
		for _, want := range []string{"planned", "provisioning", "fleetd", "auto-provision of a worker", "active"} {
			if !strings.Contains(h, want) {
				t.Errorf("history does not say %q:\n%s", want, h)
			}
		}
		show := cp.mustFleetd(t, "", "nodes", "show", "web-01", "--json").stdout
		if jsonField(show, "class") != "worker" || jsonField(show, "state") != "active" {
			t.Errorf("web-01: %s", show)
		}
	})
	t.Run("a token join of a planned device without a binding takes its declaration", func(t *testing.T) {
		node := joinedAs(t, tokenJoin(t, cp, newMachine(t, cp, uuid3, ""), false))
		if node != "db-01" {
			t.Fatalf("joined as %s, want db-01", node)
		}
		if h := cp.history(t, "db-01"); !strings.Contains(h, "a join token authorized the first installation") {
			t.Errorf("history of db-01:\n%s", h)
		}
	})
}

// Row provisioning: nodes provision (an operator's) authorizes what
// auto-provision does not; a binding the owner wrote authorizes nothing
// until a declarer writes it.
func TestLifecycleProvisioning(t *testing.T) {
	cp := startControlPlane(t, "")
	declarer, operator := cp.credential(t, "alice", "declarer"), cp.credential(t, "olga", "operator")
	sw := tpmtest.StartSwtpm(t)
	file := inventoryFile(decl{"cp-01", uuid1, "control-plane", ekPin(t, sw)}, decl{"db-01", uuid2, "worker", ""})
	// The owner writes the binding first: it authorizes nothing.
	if r := cp.apply(t, "", file); !strings.Contains(r.stdout, "not by a declarer: it will authorize nothing") {
		t.Errorf("the owner's apply does not warn: %s", r)
	}
	m := tpmMachine(t, cp, uuid1, sw, "")
	cp.mustFleetd(t, operator, "nodes", "provision", "cp-01", "--reason", "racked and cabled")
	refusedFor(t, cp, "not by a declarer: it authorizes nothing", func() result { return tpmJoin(t, m, "", false) })
	if list := cp.mustFleetd(t, "", "inventory", "list").stdout; !strings.Contains(list, "NOT honoured") {
		t.Errorf("inventory list:\n%s", list)
	}
	// The declarer applies the same file: the binding is its own now.
	if r := cp.apply(t, declarer, file); !strings.Contains(r.stdout, "written again by declarer alice") {
		t.Errorf("the declarer's apply: %s", r)
	}
	// A second planned device with a declarer's binding waits for provisioning.
	sw2 := tpmtest.StartSwtpm(t)
	cp.apply(t, declarer, file+decl{"cp-02", uuid3, "control-plane", ekPin(t, sw2)}.yaml())
	refusedFor(t, cp, "auto-provision is off", func() result { return tpmJoin(t, tpmMachine(t, cp, uuid3, sw2, ""), "", false) })

	if r := cp.fleetd(t, operator, "nodes", "provision", "cp-01", "--reason", "again"); r.code == 0 || !strings.Contains(r.stderr, "cp-01 is provisioning: provision needs state planned") {
		t.Errorf("provisioning twice: %s", r)
	}
	if node := joinedAs(t, tpmJoin(t, m, "", false)); node != "cp-01" {
		t.Fatalf("joined as %s", node)
	}
	h := cp.history(t, "cp-01")
	for _, want := range []string{"admin:olga", "racked and cabled", "provisioning", "active"} {
		if !strings.Contains(h, want) {
			t.Errorf("history does not say %q:\n%s", want, h)
		}
	}
	cp.mustFleetd(t, operator, "nodes", "provision", "db-01", "--reason", "racked")
	if node := joinedAs(t, tokenJoin(t, cp, newMachine(t, cp, uuid2, ""), false)); node != "db-01" {
		t.Errorf("a token join of a provisioning device joined as %s", node)
	}
}

// Row active: it renews; only the EK fleetd proved re-joins it; a copied
// serial with another EK, a substitute TPM and a token are refused.
func TestLifecycleActive(t *testing.T) {
	sw, other := tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t)
	// Both TPMs' EK certificates are trusted: the refusals below come
	// after each TPM proved its EK.
	cp := startControlPlane(t, "node_cert_lifetime = \"4s\"\n"+ekRootsConfig(t, sw, other)+"[inventory]\nauto_provision = true\n")
	declarer := cp.credential(t, "alice", "declarer")
	cp.apply(t, declarer, inventoryFile(decl{"web-01", uuid1, "worker", ekPin(t, sw)}))

	t.Run("a copied serial with another EK is refused before the first join", func(t *testing.T) {
		refusedFor(t, cp, "whose binding names other EKs", func() result { return tpmJoin(t, tpmMachine(t, cp, uuid1, other, ""), "", false) })
	})
	m := tpmMachine(t, cp, uuid1, sw, "")
	if node := joinedAs(t, tpmJoin(t, m, "", false)); node != "web-01" {
		t.Fatalf("joined as %s", node)
	}
	t.Run("it renews", func(t *testing.T) {
		a := startAgent(t, m)
		a.waitFor(t, renewedRE, 60*time.Second)
		_ = a.cmd.Process.Signal(os.Interrupt)
		a.wait(t, 30*time.Second)
	})
	t.Run("a substitute TPM is refused, even with a reclaim token", func(t *testing.T) {
		tok := cp.token(t, "--role", "worker", "--allow-reclaim")
		refusedFor(t, cp, "a substitute TPM", func() result { return tpmJoin(t, tpmMachine(t, cp, uuid1, other, ""), tok, false) })
	})
	t.Run("a token join is refused: the node is held to its EK", func(t *testing.T) {
		refusedFor(t, cp, "held to an EK", func() result { return tokenJoin(t, cp, newMachine(t, cp, uuid1, ""), false, "--allow-reclaim") })
	})
	t.Run("its own TPM re-joins it", func(t *testing.T) {
		if node := joinedAs(t, tpmJoin(t, m, "", true)); node != "web-01" {
			t.Errorf("re-joined as %s", node)
		}
	})
}

// Row revoked: the certificates are dead; the machine comes back only with
// fresh evidence — a reclaim token (a node without a proven EK), or its TPM
// after bcd join --reset.
func TestLifecycleRevoked(t *testing.T) {
	cp := startControlPlane(t, "[inventory]\nauto_provision = true\n")
	declarer, operator := cp.credential(t, "alice", "declarer"), cp.credential(t, "olga", "operator")
	sw := tpmtest.StartSwtpm(t)
	cp.apply(t, declarer, inventoryFile(decl{"web-01", uuid1, "worker", ekPin(t, sw)}))

	t.Run("a tpm node comes back with the same EK after --reset, not with a token", func(t *testing.T) {
		m := tpmMachine(t, cp, uuid1, sw, "")
		joinedAs(t, tpmJoin(t, m, "", false))
		cp.mustFleetd(t, operator, "nodes", "revoke", "web-01", "--reason", "disk stolen")
		wantRefusedCertificate(t, m)
		refusedFor(t, cp, "held to an EK", func() result { return tokenJoin(t, cp, m, true, "--allow-reclaim") })
		if node := joinedAs(t, tpmJoin(t, m, "", true)); node != "web-01" {
			t.Errorf("re-joined as %s", node)
		}
		h := cp.history(t, "web-01")
		if !strings.Contains(h, "revoked") || !strings.Contains(h, "admin:olga") || strings.Count(h, "active") < 2 {
			t.Errorf("history:\n%s", h)
		}
	})
	t.Run("a token node comes back only with a reclaim token", func(t *testing.T) {
		m := newMachine(t, cp, uuid2, "")
		node := m.join(t, cp)
		old, err := identity.LoadState(m.dataDir, identity.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cp.mustFleetd(t, operator, "nodes", "revoke", node, "--reason", "disk stolen")
		if code := renewWith(t, cp, old); code != codes.Unauthenticated {
			t.Errorf("renewal with a revoked certificate: %s", code)
		}
		refusedFor(t, cp, "does not allow reclaim", func() result { return tokenJoin(t, cp, m, true) })
		if got := joinedAs(t, tokenJoin(t, cp, m, true, "--allow-reclaim")); got != node {
			t.Errorf("re-joined as %s, want %s", got, node)
		}
	})
}

// Row quarantined: no renewal and no re-join by token or TPM until
// release; the session and the certificate stay.
func TestLifecycleQuarantined(t *testing.T) {
	cp := startControlPlane(t, "node_cert_lifetime = \"40s\"\nrenewal_limit = 1000\n[inventory]\nauto_provision = true\n")
	declarer, operator := cp.credential(t, "alice", "declarer"), cp.credential(t, "olga", "operator")
	sw := tpmtest.StartSwtpm(t)
	cp.apply(t, declarer, inventoryFile(decl{"web-01", uuid1, "worker", ekPin(t, sw)}))
	fast := "[renewal]\nfraction = 0.05\nbackoff_min = \"1s\"\nbackoff_max = \"1s\"\n"
	m := tpmMachine(t, cp, uuid1, sw, fast)
	joinedAs(t, tpmJoin(t, m, "", false))
	a := startAgent(t, m)
	a.waitFor(t, renewedRE, 60*time.Second)

	cp.mustFleetd(t, operator, "nodes", "quarantine", "web-01", "--reason", "boot check failed")
	a.waitFor(t, regexpMust(`msg="renewal failed".*quarantined: renewal refused until fleetd nodes release web-01`), 60*time.Second)
	_ = a.cmd.Process.Signal(os.Interrupt)
	if code := a.wait(t, 30*time.Second); code != 0 {
		t.Errorf("bcd node of a quarantined node exited %d, want 0 (it keeps its certificate):\n%s", code, a.log)
	}

	t.Run("its TPM does not re-join it", func(t *testing.T) {
		again := tpmMachine(t, cp, uuid1, sw, "")
		refusedFor(t, cp, "node web-01 is quarantined: no re-join", func() result { return tpmJoin(t, again, "", false) })
	})
	t.Run("a token does not re-join it", func(t *testing.T) {
		refusedFor(t, cp, "quarantined", func() result { return tokenJoin(t, cp, newMachine(t, cp, uuid1, ""), false, "--allow-reclaim") })
	})
	if r := cp.fleetd(t, operator, "nodes", "quarantine", "web-01", "--reason", "twice"); r.code == 0 || !strings.Contains(r.stderr, "FailedPrecondition") {
		t.Errorf("quarantine of a quarantined node: %s", r)
	}
	if r := cp.fleetd(t, operator, "nodes", "release", "web-01", "--reason", "firmware reflashed"); r.code == 0 || !strings.Contains(r.stderr, "PermissionDenied") {
		t.Errorf("an operator's release (owner only): %s", r)
	}
	cp.mustFleetd(t, "", "nodes", "release", "web-01", "--reason", "firmware reflashed")
	b := startAgent(t, m)
	b.waitFor(t, renewedRE, 60*time.Second)
	h := cp.history(t, "web-01")
	for _, want := range []string{"quarantined", "boot check failed", "firmware reflashed"} {
		if !strings.Contains(h, want) {
			t.Errorf("history does not say %q:\n%s", want, h)
		}
	}
}

// Row retired: the owner alone retires; the node never renews or re-joins;
// the machine comes back only declared again under a new name.
func TestLifecycleRetired(t *testing.T) {
	cp := startControlPlane(t, "[inventory]\nauto_provision = true\n")
	declarer, operator := cp.credential(t, "alice", "declarer"), cp.credential(t, "olga", "operator")
	sw := tpmtest.StartSwtpm(t)
	pin := ekPin(t, sw)
	file := inventoryFile(decl{"web-01", uuid1, "worker", pin})
	cp.apply(t, declarer, file)
	m := tpmMachine(t, cp, uuid1, sw, "")
	joinedAs(t, tpmJoin(t, m, "", false))
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)

	if r := cp.fleetd(t, operator, "nodes", "retire", "web-01", "--reason", "end of life"); r.code == 0 || !strings.Contains(r.stderr, "needs role owner") {
		t.Errorf("an operator's retire: %s", r)
	}
	r := cp.mustFleetd(t, "", "nodes", "retire", "web-01", "--reason", "end of life")
	if !strings.Contains(r.stdout, "node web-01 is retired") || !strings.Contains(r.stdout, "live session notified: true") {
		t.Errorf("retire: %s", r)
	}
	if code := a.wait(t, 30*time.Second); code != 1 {
		t.Errorf("bcd node of a retired node exited %d, want 1", code)
	}
	wantRefusedCertificate(t, m)
	refusedFor(t, cp, "belongs to no node", func() result { return tpmJoin(t, m, "", true) })
	refusedFor(t, cp, "node web-01 is retired", func() result { return tokenJoin(t, cp, newMachine(t, cp, uuid1, ""), false, "--allow-reclaim") })
	if r := cp.fleetd(t, "", "nodes", "delete", "web-01", "--reason", "tidy up"); r.code == 0 || !strings.Contains(r.stderr, "node web-01 is retired: its record stays") {
		t.Errorf("delete of a retired node: %s", r)
	}
	if r := cp.mustFleetd(t, declarer, "inventory", "plan", writeTemp(t, file)); !strings.Contains(r.stdout, "web-01 is retired: nothing is written") {
		t.Errorf("plan of a retired entry: %s", r)
	}

	// Declared again under a new name, the machine is planned and joins.
	// (web-01 is left out of the file: an apply removes nothing.)
	cp.apply(t, declarer, inventoryFile(decl{"web-01b", uuid1, "worker", pin}))
	if node := joinedAs(t, tpmJoin(t, m, "", true)); node != "web-01b" {
		t.Errorf("the machine declared anew joined as %s, want web-01b", node)
	}
}

func writeTemp(t *testing.T, data string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "nodes.yaml")
	if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// wantRefusedCertificate checks that m's certificate neither opens a
// session nor renews: bcd node stops at once with the refusal.
func wantRefusedCertificate(t *testing.T, m *machine) {
	t.Helper()
	b := startAgent(t, m)
	if code := b.wait(t, 30*time.Second); code != 1 || !strings.Contains(b.log.String(), "refuses this node's certificate") {
		t.Errorf("bcd node with a dead certificate: exit %d\n%s", code, b.log)
	}
}
