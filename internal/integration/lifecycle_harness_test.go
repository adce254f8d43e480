package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// fleetd runs an admin command against cp, as the owner (cred "") or as
// the credential folder cred.
func (cp *controlPlane) fleetd(t *testing.T, cred string, args ...string) result {
	t.Helper()
	args = append(args, "--config", cp.config)
	if cred != "" {
		args = append(args, "--credential", cred)
	}
	return run(t, "", nil, "fleetd", args...)
}

// mustFleetd is fleetd that must exit 0.
func (cp *controlPlane) mustFleetd(t *testing.T, cred string, args ...string) result {
	t.Helper()
	r := cp.fleetd(t, cred, args...)
	if r.code != 0 {
		t.Fatalf("fleetd %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// credential makes an admin credential of role and returns its folder.
func (cp *controlPlane) credential(t *testing.T, name, role string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "admin-"+name)
	cp.mustFleetd(t, "", "admin", "create", "--name", name, "--role", role, "--out", dir)
	return dir
}

// apply applies an inventory file as cred.
func (cp *controlPlane) apply(t *testing.T, cred, yaml string) result {
	t.Helper()
	f := filepath.Join(t.TempDir(), "nodes.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return cp.mustFleetd(t, cred, "inventory", "apply", f)
}

// ekPin is the pin of the EK bcd's tpm join proves on sw.
func ekPin(t *testing.T, sw *tpmtest.Swtpm) string {
	t.Helper()
	tp := sw.Open(t)
	defer tp.Close()
	ek, err := tp.EK(context.Background(), tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := attest.EKPublic(ek.PublicArea)
	if err != nil {
		t.Fatal(err)
	}
	pin, err := attest.EKPin(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pin
}

// decl is one inventory entry.
type decl struct {
	name, uuid, class, pin string
}

func (d decl) yaml() string {
	s := fmt.Sprintf("  - name: %s\n    product_uuid: %s\n    class: %s\n    site: rack1\n", d.name, d.uuid, d.class)
	if d.pin != "" {
		s += fmt.Sprintf("    ek_binding:\n      pins: [%q]\n      source: receiving-scan\n", d.pin)
	}
	return s
}

func inventoryFile(ds ...decl) string {
	var b strings.Builder
	b.WriteString("version: 1\nnodes:\n")
	for _, d := range ds {
		b.WriteString(d.yaml())
	}
	return b.String()
}

// tpmMachine is a machine with product UUID uuid and the swtpm sw.
func tpmMachine(t *testing.T, cp *controlPlane, uuid string, sw *tpmtest.Swtpm, extra string) *machine {
	t.Helper()
	return newMachine(t, cp, uuid, "tpm = \""+sw.Spec()+"\"\n"+extra)
}

// tpmJoin runs bcd join --attestor tpm on m, with a token when tok is
// not empty, and --reset --yes when reset.
func tpmJoin(t *testing.T, m *machine, tok string, reset bool) result {
	t.Helper()
	args := []string{"join", "--config", m.cfg, "--attestor", "tpm"}
	if reset {
		args = append(args, "--reset", "--yes")
	}
	return run(t, tok, m.env(), "bcd", args...)
}

// tokenJoin runs a token join on m with a token made with tokenArgs.
func tokenJoin(t *testing.T, cp *controlPlane, m *machine, reset bool, tokenArgs ...string) result {
	t.Helper()
	tok := cp.token(t, append([]string{"--role", "worker"}, tokenArgs...)...)
	args := []string{"join", "--config", m.cfg}
	if reset {
		args = append(args, "--reset", "--yes")
	}
	return run(t, tok, m.env(), "bcd", args...)
}

// joinedAs returns the node id of a successful join, failing the test
// otherwise.
func joinedAs(t *testing.T, r result) string {
	t.Helper()
	mm := joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout)))
	if r.code != 0 || mm == nil {
		t.Fatalf("join: %s", r)
	}
	return mm[1]
}

// refusedFor runs join, checks it was refused, and that the server logged
// why while it ran.
func refusedFor(t *testing.T, cp *controlPlane, why string, join func() result) {
	t.Helper()
	before := len(cp.log.String())
	assertRefused(t, join())
	if logged := cp.log.String()[before:]; !strings.Contains(logged, why) {
		t.Errorf("the server did not log %q for this join:\n%s", why, tail(logged, 30))
	}
}

// history returns fleetd nodes history ID as "from>to by actor" lines.
func (cp *controlPlane) history(t *testing.T, id string) string {
	t.Helper()
	return cp.mustFleetd(t, "", "nodes", "history", id).stdout
}
