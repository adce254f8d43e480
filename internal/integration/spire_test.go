package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/spireexport"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// The SPIRE export against a real SPIRE server and agents
// (docs/spire.md): fleetd serves the export over HTTPS; fleetd export
// spire applies it through the server's admin socket.

const spireTD = "test.nodetrust.example"

// exportCP starts a control plane with its HTTPS listener and extra
// configuration, and returns it with the HTTPS address.
func exportCP(t *testing.T, extra string) (*controlPlane, string) {
	t.Helper()
	cp := startControlPlane(t, "http_listen = \"127.0.0.1:0\"\n"+extra)
	m := httpsRE.FindStringSubmatch(cp.log.String())
	if m == nil {
		t.Fatalf("fleetd did not say its HTTPS address:\n%s", cp.log)
	}
	return cp, m[1]
}

// joinNode joins a machine by token as id and returns it.
func joinNode(t *testing.T, cp *controlPlane, id string) *machine {
	t.Helper()
	m := newMachine(t, cp, "", "")
	if got := m.join(t, cp, "--node-id", id); got != id {
		t.Fatalf("joined as %s, want %s", got, id)
	}
	return m
}

// exportSPIRE runs fleetd export spire as cred against s.
func exportSPIRE(t *testing.T, cp *controlPlane, https, cred string, s *spireServer, args ...string) result {
	t.Helper()
	return cp.fleetd(t, cred, append([]string{"export", "spire", "--https", https, "--socket", s.socket}, args...)...)
}

func nodeSID(id string) string { return "spiffe://" + spireTD + "/node/" + id }

func fleetEntryIDs(t *testing.T, s *spireServer) string {
	t.Helper()
	var ids []string
	for id := range s.entriesByHint(t, spireexport.Hint) {
		ids = append(ids, id)
	}
	return strings.Join(sorted(ids), ",")
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestSPIREExportAppliesAndWithdraws(t *testing.T) {
	cp, https := exportCP(t, "")
	s := startSPIRE(t, spireTD)
	for _, id := range []string{"web-a", "web-b", "web-c"} {
		joinNode(t, cp, id)
	}
	agentA := s.startAgent(t, nodeSID("web-a"))
	agentB := s.startAgent(t, nodeSID("web-b"))
	// Registrations nodetrust did not create: a workload under the server,
	// and one under agent B (which then still carries B's agent).
	s.createEntry(t, "spiffe://"+spireTD+"/workload/billing", "spiffe://"+spireTD+"/spire/server", "unix:uid:1000")
	s.createEntry(t, "spiffe://"+spireTD+"/workload/b-db", agentB, "unix:uid:1001")
	foreign := s.notOwned(t)

	// The export over HTTPS needs an admin credential: an auditor reads it.
	auditor, operator := cp.credential(t, "audra", "auditor"), cp.credential(t, "olga", "operator")
	show := cp.mustFleetd(t, auditor, "export", "show", "--https", https)
	var env struct {
		Version  int             `json:"version"`
		Digest   string          `json:"digest"`
		Document json.RawMessage `json:"document"`
	}
	if err := json.Unmarshal([]byte(show.stdout), &env); err != nil || env.Version != 1 || !strings.HasPrefix(env.Digest, "sha256:") ||
		!strings.Contains(string(env.Document), `"x509pop:subject:cn:web-a"`) {
		t.Fatalf("export show: %v\n%s", err, show)
	}

	// Entries created for the eligible nodes, marked fleet-owned.
	r := exportSPIRE(t, cp, https, operator, s)
	if r.code != 0 || !strings.Contains(r.stdout, "applied: 3 create") {
		t.Fatalf("first run: %s", r)
	}
	if got := fleetEntryIDs(t, s); got != "nodetrust.x509pop.web-a,nodetrust.x509pop.web-b,nodetrust.x509pop.web-c" {
		t.Fatalf("fleet-owned entries %s", got)
	}
	e := s.entriesByHint(t, spireexport.Hint)["nodetrust.x509pop.web-a"]
	if e.ParentId.Path != "/spire/server" || e.SpiffeId.Path != "/node/web-a" || len(e.Selectors) != 2 {
		t.Fatalf("web-a's entry %v", e)
	}
	if r := exportSPIRE(t, cp, https, operator, s); r.code != 0 || !strings.Contains(r.stdout, "unchanged") {
		t.Fatalf("a second run changed something: %s", r)
	}

	// web-a retired: the dry run says what would go and changes nothing;
	// the run deletes its entry and bans its attested agent.
	cp.mustFleetd(t, "", "nodes", "retire", "web-a", "--reason", "decommissioned")
	dry := exportSPIRE(t, cp, https, auditor, s, "--dry-run")
	if dry.code != 0 || !strings.Contains(dry.stdout, "delete  nodetrust.x509pop.web-a") || !strings.Contains(dry.stdout, "ban     "+agentA) {
		t.Fatalf("dry run: %s", dry)
	}
	if !strings.Contains(fleetEntryIDs(t, s), "web-a") || s.banned(t, agentA) {
		t.Fatal("the dry run changed the SPIRE server")
	}
	if r := exportSPIRE(t, cp, https, auditor, s); r.code == 0 || !strings.Contains(r.stderr, "needs role owner or operator") {
		t.Errorf("an auditor's run: %s", r)
	}
	r = exportSPIRE(t, cp, https, operator, s)
	if r.code != 0 || !strings.Contains(r.stdout, "1 delete, 1 ban") {
		t.Fatalf("run after the retirement: %s", r)
	}
	if got := fleetEntryIDs(t, s); got != "nodetrust.x509pop.web-b,nodetrust.x509pop.web-c" {
		t.Errorf("fleet-owned entries after web-a's retirement: %s", got)
	}
	if !s.banned(t, agentA) {
		t.Errorf("web-a's agent %s is not banned", agentA)
	}

	// web-b revoked (it leaves the export, not retired): its entry goes,
	// but its agent stays: another registration still carries it.
	cp.mustFleetd(t, "", "nodes", "revoke", "web-b", "--reason", "suspicious")
	r = exportSPIRE(t, cp, https, operator, s)
	if r.code != 0 || !strings.Contains(r.stdout, "1 delete, 0 ban") || !strings.Contains(r.stdout, "keep    "+agentB) {
		t.Fatalf("run after web-b's revocation: %s", r)
	}
	if s.banned(t, agentB) {
		t.Errorf("web-b's agent is banned although another registration carries it")
	}
	if got := fleetEntryIDs(t, s); got != "nodetrust.x509pop.web-c" {
		t.Errorf("fleet-owned entries: %s", got)
	}

	// Entries nodetrust did not create are untouched (same ids and
	// revisions), SPIRE's join-token aliases included.
	if after := s.notOwned(t); !equalRevisions(foreign, after) {
		t.Errorf("entries nodetrust does not own changed:\nbefore %v\nafter  %v", foreign, after)
	}
	// Each run is in the audit trail.
	if n := strings.Count(cp.log.String(), `msg="SPIRE export run"`); n < 4 {
		t.Errorf("%d export runs logged, want at least 4", n)
	}
}

func equalRevisions(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// setupApplied starts a control plane with nodes and a SPIRE server, and
// applies the export once.
func setupApplied(t *testing.T, nodes ...string) (*controlPlane, string, *spireServer, string) {
	t.Helper()
	cp, https := exportCP(t, "")
	s := startSPIRE(t, spireTD)
	for _, id := range nodes {
		joinNode(t, cp, id)
	}
	operator := cp.credential(t, "olga", "operator")
	if r := exportSPIRE(t, cp, https, operator, s); r.code != 0 {
		t.Fatalf("first run: %s", r)
	}
	return cp, https, s, operator
}

func TestSPIREExportSafeguardEmptyDeviceList(t *testing.T) {
	cp, https, s, operator := setupApplied(t, "web-a")
	before := fleetEntryIDs(t, s)
	// The only node leaves the export: the device list is empty.
	cp.mustFleetd(t, "", "nodes", "revoke", "web-a", "--reason", "inventory fault drill")
	r := exportSPIRE(t, cp, https, operator, s)
	if r.code != 3 || !strings.Contains(r.stdout, "held: the export lists no eligible device") {
		t.Fatalf("run on an empty device list: %s", r)
	}
	if got := fleetEntryIDs(t, s); got != before || got == "" {
		t.Errorf("entries %q, want them preserved (%q)", got, before)
	}
	if !strings.Contains(cp.log.String(), "held") {
		t.Errorf("the held run is not logged")
	}
}

func TestSPIREExportSafeguardMalformedExport(t *testing.T) {
	cp, https, s, operator := setupApplied(t, "web-a", "web-b")
	before := fleetEntryIDs(t, s)
	good := cp.mustFleetd(t, operator, "export", "show", "--https", https).stdout
	dir := t.TempDir()
	for name, data := range map[string]string{
		"truncated":    good[:len(good)/2],
		"unverifiable": strings.Replace(good, `"node_id": "web-b"`, `"node_id": "web-x"`, 1),
	} {
		f := filepath.Join(dir, name+".json")
		if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		r := exportSPIRE(t, cp, https, operator, s, "--from", f)
		if r.code != 3 || !strings.Contains(r.stdout, "held: the export could not be read or verified") {
			t.Errorf("%s export: %s", name, r)
		}
		if got := fleetEntryIDs(t, s); got != before {
			t.Errorf("%s export: entries %q, want %q preserved", name, got, before)
		}
	}
}

var heldDigestRE = regexp.MustCompile(`fleetd export allow --digest (sha256:[0-9a-f]{64})`)

func TestSPIREExportSafeguardTwoWithdrawalsHeldUntilAllowed(t *testing.T) {
	cp, https, s, operator := setupApplied(t, "web-a", "web-b", "web-c")
	cp.mustFleetd(t, "", "nodes", "revoke", "web-a", "--reason", "batch")
	cp.mustFleetd(t, "", "nodes", "revoke", "web-b", "--reason", "batch")
	r := exportSPIRE(t, cp, https, operator, s)
	m := heldDigestRE.FindStringSubmatch(r.stdout)
	if r.code != 3 || m == nil || !strings.Contains(r.stdout, "withdraw or ban 2 nodes at once (threshold 1)") {
		t.Fatalf("two withdrawals at once: %s", r)
	}
	digest := m[1]
	if got := fleetEntryIDs(t, s); got != "nodetrust.x509pop.web-a,nodetrust.x509pop.web-b,nodetrust.x509pop.web-c" {
		t.Fatalf("the held run changed entries: %s", got)
	}
	// Held until allowed: the next run holds it again.
	if r := exportSPIRE(t, cp, https, operator, s); r.code != 3 {
		t.Fatalf("second run before the allowance: %s", r)
	}
	if held := cp.mustFleetd(t, operator, "export", "held", "--https", https); !strings.Contains(held.stdout, digest) {
		t.Errorf("export held does not list %s: %s", digest, held)
	}
	if r := cp.fleetd(t, operator, "export", "allow", "--https", https, "--digest", digest, "--reason", "planned"); r.code == 0 || !strings.Contains(r.stderr, "needs role owner") {
		t.Errorf("an operator's allow: %s", r)
	}
	cp.mustFleetd(t, "", "export", "allow", "--https", https, "--digest", digest, "--reason", "planned decommissioning of rack 1")
	r = exportSPIRE(t, cp, https, operator, s)
	if r.code != 0 || !strings.Contains(r.stdout, "0 create, 0 update, 2 delete") {
		t.Fatalf("run after the allowance: %s", r)
	}
	if got := fleetEntryIDs(t, s); got != "nodetrust.x509pop.web-c" {
		t.Errorf("entries after the allowed run: %s", got)
	}
	if !strings.Contains(cp.log.String(), "held SPIRE export change allowed") {
		t.Errorf("the allowance is not logged")
	}
}

// Retirement end to end with fleetd serve applying the export itself:
// the session ends, renewal and re-join are refused, the join
// credentials go, the SPIRE entry goes and the agent is banned.
func TestRetirementEndToEndWithSPIRE(t *testing.T) {
	s := startSPIRE(t, spireTD)
	cp, https := exportCP(t, "[export.spire]\nsocket = \""+s.socket+"\"\ninterval = \"1h\"\n")
	m := joinNode(t, cp, "web-a")
	joinNode(t, cp, "web-b")
	agentA := s.startAgent(t, nodeSID("web-a"))
	operator := cp.credential(t, "olga", "operator")
	if r := exportSPIRE(t, cp, https, operator, s); r.code != 0 || !strings.Contains(r.stdout, "2 create") {
		t.Fatalf("first run: %s", r)
	}
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)
	// A token made for web-a, never used: a join credential retirement
	// deletes.
	cp.token(t, "--role", "worker", "--node-id", "web-a")

	r := cp.mustFleetd(t, "", "nodes", "retire", "web-a", "--reason", "end of life")
	if !strings.Contains(r.stdout, "node web-a is retired") || !strings.Contains(r.stdout, "live session notified: true") || strings.Contains(r.stderr, "warning") {
		t.Fatalf("retire: %s", r)
	}
	if code := a.wait(t, 30*time.Second); code != 1 {
		t.Errorf("bcd node of the retired node exited %d, want 1", code)
	}
	tokens := cp.mustFleetd(t, "", "token", "list").stdout
	for _, line := range strings.Split(tokens, "\n") {
		if f := strings.Fields(line); len(f) == 7 && f[3] == "web-a" && f[6] == "-" {
			t.Errorf("an unused token for web-a survived its retirement:\n%s", tokens)
		}
	}
	wantRefusedCertificate(t, m)
	refusedFor(t, cp, "node web-a is retired", func() result {
		return tokenJoin(t, cp, newMachine(t, cp, "", ""), false, "--node-id", "web-a", "--allow-reclaim")
	})
	// fleetd serve's own run, after the retirement: entry gone, agent banned.
	if got := fleetEntryIDs(t, s); got != "nodetrust.x509pop.web-b" {
		t.Errorf("fleet-owned entries after the retirement: %s", got)
	}
	if !s.banned(t, agentA) {
		t.Errorf("web-a's agent is not banned")
	}
}

// TestBootQuarantineWithdrawsFromSPIRE: a worker quarantined by a failed
// boot check leaves the export, and the next export run deletes its
// fleet-owned registration; the other node's stays.
func TestBootQuarantineWithdrawsFromSPIRE(t *testing.T) {
	s := startSPIRE(t, spireTD)
	sw := tpmtest.StartSwtpm(t)
	webhook, cordons := fakeCordonReceiver(t)
	cp, https := exportCP(t, ekRootsConfig(t, sw)+bootPolicyConfig(t, webhook))
	eventLog := filepath.Join(t.TempDir(), "binary_bios_measurements")
	m := tpmMachine(t, cp, uuid1, sw, "[boot_check]\nevent_log = \""+eventLog+"\"\n")
	node := joinedAs(t, tpmJoin(t, m, cp.token(t, "--role", "worker"), false))
	joinNode(t, cp, "web-b")
	operator := cp.credential(t, "olga", "operator")
	if r := exportSPIRE(t, cp, https, operator, s); r.code != 0 || !strings.Contains(r.stdout, "applied: ") {
		t.Fatalf("first run: %s", r)
	}
	if got := fleetEntryIDs(t, s); !strings.Contains(got, "."+node) || !strings.Contains(got, "nodetrust.x509pop.web-b") {
		t.Fatalf("fleet-owned entries %s, want %s's and web-b's", got, node)
	}
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)

	// The node's log stops replaying: its boot check fails, it is
	// quarantined.
	writeFalseLog(t, eventLog)
	if r := cp.fleetd(t, "", "nodes", "check", node); r.code != 1 || !strings.Contains(r.stdout, "FAIL event_log") {
		t.Fatalf("check of a boot whose log does not replay: %s", r)
	}
	if st := cp.nodeState(t, node); st != "quarantined" {
		t.Fatalf("state %s after a failed boot check, want quarantined", st)
	}
	select {
	case id := <-cordons:
		if id != node {
			t.Errorf("cordon of %s, want %s", id, node)
		}
	case <-time.After(30 * time.Second):
		t.Error("no cordon reached the webhook receiver")
	}
	r := exportSPIRE(t, cp, https, operator, s)
	if r.code != 0 || !regexp.MustCompile(`[1-9] delete`).MatchString(r.stdout) {
		t.Fatalf("run after the quarantine: %s", r)
	}
	if got := fleetEntryIDs(t, s); got != "nodetrust.x509pop.web-b" {
		t.Errorf("fleet-owned entries after %s's quarantine: %s, want web-b's alone", node, got)
	}
}
