package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/inventory/netbox/netboxfake"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// Each role is refused what it may not do, with the roles needed named;
// every admin call is audited with the credential's name; a revoked
// credential is refused at its next call.
func TestAdminRolesAreEnforced(t *testing.T) {
	cp := startControlPlane(t, "")
	declarer := cp.credential(t, "alice", "declarer")
	operator := cp.credential(t, "olga", "operator")
	auditor := cp.credential(t, "audrey", "auditor")
	for _, f := range []string{"admin.crt", "admin.key", "pki-bundle.json"} {
		if st, err := os.Stat(filepath.Join(declarer, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want mode 0600", f, st.Mode(), err)
		}
	}
	if st, _ := os.Stat(declarer); st.Mode().Perm() != 0o700 {
		t.Errorf("the credential folder has mode %v, want 0700", st.Mode().Perm())
	}
	file := writeTemp(t, inventoryFile(decl{"web-01", uuid1, "worker", ""}))
	m := newMachine(t, cp, "", "")
	node := m.join(t, cp)

	for _, tt := range []struct {
		who   string
		cred  string
		args  []string
		needs string
	}{
		{"a declarer", declarer, []string{"token", "create", "--role", "worker"}, "needs role owner or operator"},
		{"a declarer", declarer, []string{"nodes", "list"}, "needs role owner, operator or auditor"},
		{"a declarer", declarer, []string{"nodes", "quarantine", node, "--reason", "x"}, "needs role owner or operator"},
		{"an operator", operator, []string{"inventory", "apply", file}, "needs role owner or declarer"},
		{"an operator", operator, []string{"nodes", "retire", node, "--reason", "x"}, "needs role owner"},
		{"an operator", operator, []string{"nodes", "delete", node}, "needs role owner"},
		{"an operator", operator, []string{"admin", "list"}, "needs role owner or auditor"},
		{"an auditor", auditor, []string{"token", "create", "--role", "worker"}, "needs role owner or operator"},
		{"an auditor", auditor, []string{"nodes", "revoke", node, "--reason", "x"}, "needs role owner or operator"},
		{"an auditor", auditor, []string{"inventory", "apply", file}, "needs role owner or declarer"},
		{"an auditor", auditor, []string{"admin", "create", "--name", "eve", "--role", "owner", "--out", filepath.Join(t.TempDir(), "eve")}, "needs role owner"},
	} {
		t.Run(tt.who+" may not "+strings.Join(tt.args[:2], " "), func(t *testing.T) {
			r := cp.fleetd(t, tt.cred, tt.args...)
			if r.code == 0 || !strings.Contains(r.stderr, tt.needs) || !strings.Contains(r.stderr, "PermissionDenied") {
				t.Errorf("%s: %s", strings.Join(tt.args, " "), r)
			}
		})
	}
	t.Run("each role may do its own work", func(t *testing.T) {
		cp.mustFleetd(t, declarer, "inventory", "apply", file)
		cp.mustFleetd(t, operator, "token", "create", "--role", "worker")
		cp.mustFleetd(t, operator, "nodes", "quarantine", node, "--reason", "checking")
		cp.mustFleetd(t, auditor, "nodes", "list")
		cp.mustFleetd(t, auditor, "inventory", "list")
		if list := cp.mustFleetd(t, auditor, "admin", "list").stdout; !strings.Contains(list, "alice") || !strings.Contains(list, "declarer") {
			t.Errorf("admin list:\n%s", list)
		}
	})
	t.Run("a revoked credential is refused at its next call", func(t *testing.T) {
		cp.mustFleetd(t, "", "admin", "revoke", "olga", "--reason", "left the team")
		if r := cp.fleetd(t, operator, "nodes", "list"); r.code == 0 || !strings.Contains(r.stderr, "admin credential olga") || !strings.Contains(r.stderr, "was revoked") {
			t.Errorf("a revoked operator: %s", r)
		}
	})

	cp.stop(t)
	st, err := sqlite.Open(context.Background(), filepath.Join(cp.dir, "data", "fleetd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	events, err := st.ListAudit(context.Background(), 10000)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range events {
		seen[e.Actor+" "+e.Action+" "+e.Subject] = true
	}
	for _, want := range []string{"admin:alice admin.refused CreateToken", "admin:alice admin.call ApplyInventory", "admin:olga admin.call TransitionNode",
		"admin:audrey admin.call ListNodes", "admin:owner admin.call CreateAdmin", "admin:olga node.quarantine " + node, "admin:alice inventory.apply inventory"} {
		if !seen[want] {
			t.Errorf("the audit trail has no %q", want)
		}
	}
}

// sampleInventory is an inventory of n workers, each with an EK binding.
func sampleInventory(n int) string {
	var b strings.Builder
	b.WriteString("version: 1\nnodes:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: node-%04d\n    serial: SN-%06d\n    product_uuid: 6a1f5c1e-0000-4000-8000-%012x\n    macs: [\"02:00:00:%02x:%02x:01\"]\n    class: worker\n    site: rack%d\n    role: worker\n    expected_port: {chassis: sw-%d, port: ge-0/0/%d}\n    ek_binding:\n      pins: [\"sha256:%064x\"]\n      source: supplier-record\n",
			i, i, i, i/256, i%256, i/40, i/48, i%48, i+1)
	}
	return b.String()
}

// An inventory of 1,000 machines: planned, applied, applied again with no
// change; every field's writer recorded; a malformed file changes nothing.
func TestInventoryOfAThousandMachines(t *testing.T) {
	cp := startControlPlane(t, "")
	declarer := cp.credential(t, "alice", "declarer")
	file := writeTemp(t, sampleInventory(1000))

	plan := cp.mustFleetd(t, declarer, "inventory", "plan", file)
	if !strings.Contains(plan.stdout, "Plan: 1000 to add, 0 to update, 0 unchanged") || !strings.Contains(plan.stdout, "+ node-0999 (add)") {
		t.Fatalf("plan: %s", tail(plan.stdout, 5))
	}
	if list := cp.mustFleetd(t, declarer, "inventory", "list", "--json").stdout; strings.TrimSpace(list) != "[]" {
		t.Fatalf("a plan wrote declarations: %s", list)
	}
	applied := cp.mustFleetd(t, declarer, "inventory", "apply", file)
	if !strings.Contains(applied.stdout, "Applied (request ") || !strings.Contains(applied.stdout, "1000 to add") {
		t.Fatalf("apply: %s", tail(applied.stdout, 3))
	}
	again := cp.mustFleetd(t, declarer, "inventory", "apply", file)
	if !strings.Contains(again.stdout, "Plan: 0 to add, 0 to update, 1000 unchanged") {
		t.Errorf("applying the same file again: %s", tail(again.stdout, 3))
	}

	var changes []struct {
		Device    string `json:"device"`
		Field     string `json:"field"`
		Actor     string `json:"actor"`
		ActorRole string `json:"actor_role"`
		RequestID string `json:"request_id"`
	}
	out := cp.mustFleetd(t, declarer, "inventory", "changes", "--limit", "20000", "--json").stdout
	if err := json.Unmarshal([]byte(out), &changes); err != nil {
		t.Fatal(err)
	}
	fields := map[string]int{}
	for _, c := range changes {
		if c.Actor != "alice" || c.ActorRole != "declarer" || c.RequestID == "" {
			t.Fatalf("a change without its writer: %+v", c)
		}
		fields[c.Field]++
	}
	if len(changes) != 10000 {
		t.Errorf("%d changes, want 10 fields for each of 1000 machines", len(changes))
	}
	for _, f := range []string{"serial", "product_uuid", "macs", "class", "site", "role", "expected_port.chassis", "expected_port.port", "ek_binding.pins", "ek_binding.source"} {
		if fields[f] != 1000 {
			t.Errorf("field %s written %d times, want 1000", f, fields[f])
		}
	}

	t.Run("a malformed file changes nothing and lists every error by line", func(t *testing.T) {
		bad := strings.Replace(sampleInventory(1000), "    class: worker\n", "    class: gpu\n", 1)
		bad = strings.Replace(bad, "site: rack0\n", "site: rack-new\n", 1) + "  - name: BAD\n    class: worker\n"
		r := cp.fleetd(t, declarer, "inventory", "apply", writeTemp(t, bad))
		if r.code == 0 || !strings.Contains(r.stderr, `line 7: class "gpu" is not one of`) || !strings.Contains(r.stderr, "InvalidArgument") ||
			!strings.Contains(r.stderr, "nothing was changed") || !strings.Contains(r.stderr, `node id "BAD"`) {
			t.Errorf("apply of a malformed file: %s", r)
		}
		again := cp.mustFleetd(t, declarer, "inventory", "plan", file)
		if !strings.Contains(again.stdout, "Plan: 0 to add, 0 to update, 1000 unchanged") {
			t.Errorf("after the malformed file: %s", tail(again.stdout, 3))
		}
		if n := strings.Count(cp.mustFleetd(t, declarer, "inventory", "changes", "--limit", "20000").stdout, "\n"); n != 10001 {
			t.Errorf("the changelog has %d lines after a refused file, want 10001", n)
		}
	})
}

// With [inventory] required, a join of an undeclared machine waits as a
// claim; declared, it joins.
func TestInventoryRequired(t *testing.T) {
	cp := startControlPlane(t, "[inventory]\nrequired = true\n")
	m := newMachine(t, cp, uuid1, "")
	for range 2 {
		refusedFor(t, cp, "the inventory is required", func() result { return tokenJoin(t, cp, m, false) })
	}
	var claims []struct {
		Key    string `json:"key"`
		Count  uint64 `json:"count"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal([]byte(cp.mustFleetd(t, "", "claims", "list", "--json").stdout), &claims); err != nil {
		t.Fatal(err)
	}
	if len(claims) != 1 || claims[0].Key != "uuid:"+uuid1 || claims[0].Count != 2 {
		t.Fatalf("claims: %+v", claims)
	}
	cp.apply(t, cp.credential(t, "alice", "declarer"), inventoryFile(decl{"web-01", uuid1, "worker", ""}))
	if node := joinedAs(t, tokenJoin(t, cp, m, false)); node != "web-01" {
		t.Errorf("the declared machine joined as %s", node)
	}
	if out := cp.mustFleetd(t, "", "claims", "list", "--json").stdout; strings.TrimSpace(out) != "[]" {
		t.Errorf("the join left its claim: %s", out)
	}
}

// The NetBox source, against the fake NetBox: a binding the declarer user
// wrote admits its machine, another user's does not; with NetBox down a
// join is refused and nothing already issued changes.
func TestNetBoxSource(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef01234567"
	nb := netboxfake.Start(token)
	t.Cleanup(nb.Close)
	tokenFile := filepath.Join(t.TempDir(), "netbox-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t, fmt.Sprintf("node_cert_lifetime = \"4s\"\nrenewal_limit = 1000\n[inventory]\nauto_provision = true\nsource = \"netbox\"\n[inventory.netbox]\nurl = %q\ntoken_file = %q\ndeclarer_user = \"terraform\"\n", nb.URL, tokenFile))
	sw1, sw2, sw3 := tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t)
	device := func(name, uuid, pin string) netboxfake.Device {
		return netboxfake.Device{Name: name, Site: "rack1", Role: "worker", CustomFields: map[string]any{
			"product_uuid": uuid, "class": "worker", "ek_pins": pin, "ek_source": "receiving-scan"}}
	}
	nb.Put("terraform", device("web-1", uuid1, ekPin(t, sw1)))
	nb.Put("admin", device("web-2", uuid2, ekPin(t, sw2)))
	nb.Put("terraform", device("web-3", uuid3, ekPin(t, sw3)))

	m1 := tpmMachine(t, cp, uuid1, sw1, "")
	if node := joinedAs(t, tpmJoin(t, m1, "", false)); node != "web-1" {
		t.Fatalf("joined as %s", node)
	}
	refusedFor(t, cp, "not by the declarer user terraform", func() result { return tpmJoin(t, tpmMachine(t, cp, uuid2, sw2, ""), "", false) })

	a := startAgent(t, m1)
	a.waitFor(t, renewedRE, 60*time.Second)
	nb.SetDown(true)
	m3 := tpmMachine(t, cp, uuid3, sw3, "")
	refusedFor(t, cp, "the inventory source cannot answer", func() result { return tpmJoin(t, m3, "", false) })
	// Nothing already issued changes: web-1 keeps renewing.
	a.waitFor(t, renewedRE, 60*time.Second)
	if show := cp.mustFleetd(t, "", "nodes", "show", "web-1", "--json").stdout; jsonField(show, "state") != "active" {
		t.Errorf("web-1 with NetBox down: %s", show)
	}
	nb.SetDown(false)
	if node := joinedAs(t, tpmJoin(t, m3, "", false)); node != "web-3" {
		t.Errorf("with NetBox back, joined as %s", node)
	}
	if r := cp.fleetd(t, "", "inventory", "apply", writeTemp(t, inventoryFile(decl{"x-1", uuid1, "worker", ""}))); r.code == 0 || !strings.Contains(r.stderr, "declarations come from netbox") {
		t.Errorf("apply with the NetBox source: %s", r)
	}
}
