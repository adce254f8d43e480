package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// clearTPM clears the swtpm's owner hierarchy with tpm2-tools, as an
// operator's "clear the TPM" in the firmware does: the keys derived under
// it change, the EK does not.
func clearTPM(t *testing.T, sw *tpmtest.Swtpm) {
	t.Helper()
	cmd := exec.Command("tpm2_clear")
	cmd.Env = append(os.Environ(), "TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port="+strings.TrimPrefix(sw.Spec(), "tcp://127.0.0.1:"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tpm2_clear: %v\n%s", err, out)
	}
}

func TestATPMNodeFollowsItsWayBackLiterallyFromTheShippedUnit(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	cp := startControlPlane(t, ekRootsConfig(t, sw))
	// The machine's config says [join] attestor = "tpm"; the unit's
	// command is bcd join --config … --token-file /etc/bcd/join-token.
	m := newMachine(t, cp, "", "tpm = \""+sw.Spec()+"\"\n[join]\nattestor = \"tpm\"\n")
	tokenFile := filepath.Join(filepath.Dir(m.cfg), "join-token")
	if err := os.WriteFile(tokenFile, []byte(cp.token(t, "--role", "gpu", "--site", "rack7")), 0o600); err != nil {
		t.Fatal(err)
	}
	unit := []string{"join", "--config", m.cfg, "--token-file", tokenFile}
	r := run(t, "", m.env(), "bcd", unit...)
	mm := joinedRE.FindStringSubmatch(r.stdout)
	if r.code != 0 || mm == nil {
		t.Fatalf("the unit's first join: %s", r)
	}
	node := mm[1]
	// The install script removes the token after the first join.
	if err := os.Remove(tokenFile); err != nil {
		t.Fatal(err)
	}
	if r := run(t, "", m.env(), "bcd", unit...); r.code != 0 || !strings.HasPrefix(r.stdout, "already joined as "+node) {
		t.Fatalf("the unit on the next boot: %s", r)
	}

	// The owner hierarchy is cleared: node.key's record derives another
	// key. Doctor and status give the TPM's way back, not a token's.
	clearTPM(t, sw)
	const tpmWayBack = "bcd join --reset --yes --attestor tpm"
	doc := run(t, "", nil, "bcd", "doctor", "--config", m.cfg)
	if doc.code != 1 || !strings.Contains(doc.stdout, "the node key does not match the node certificate") ||
		!strings.Contains(doc.stdout, "→ "+tpmWayBack) || strings.Contains(doc.stdout, "token.txt") {
		t.Fatalf("doctor on a cleared TPM: %s", doc)
	}
	st := run(t, "", nil, "bcd", "status", "--config", m.cfg)
	if st.code != 1 || !strings.Contains(st.stderr, "join again: "+tpmWayBack) {
		t.Errorf("status on a cleared TPM: %s", st)
	}

	// Done literally (with this machine's --config), the way back works:
	// no token, the EK reclaims.
	r = run(t, "", m.env(), "bcd", append(strings.Fields(tpmWayBack)[1:], "--config", m.cfg)...)
	mm = joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout)))
	if r.code != 0 || mm == nil || mm[1] != node || mm[2] != "rack7" || mm[3] != "gpu" {
		t.Fatalf("%s --config: %s", tpmWayBack, r)
	}
	if strings.Contains(r.stderr, "no join token") {
		t.Errorf("the TPM's way back asked for a token: %s", r)
	}

	// After a reinstall (the data directory wiped) the shipped unit itself
	// brings the machine back: the token file is gone, the EK is known.
	if err := os.RemoveAll(m.dataDir); err != nil {
		t.Fatal(err)
	}
	r = run(t, "", m.env(), "bcd", unit...)
	mm = joinedRE.FindStringSubmatch(r.stdout)
	if r.code != 0 || mm == nil || mm[1] != node || !strings.Contains(r.stderr, "joining with the TPM alone") {
		t.Fatalf("the unit after a reinstall: %s", r)
	}
}

var tokenUsedRE = regexp.MustCompile(`"used_by_node": "([^"]*)"`)

func TestTPMJoinsWithApprovalAndAPipedTokenForAKnownEK(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	cp := startControlPlane(t, "pending_poll = \"1s\"\n"+ekRootsConfig(t, sw))
	m := newMachine(t, cp, "", "tpm = \""+sw.Spec()+"\"\n[join]\nattestor = \"tpm\"\n")

	var node string
	t.Run("a token that requires approval holds a TPM join until approved", func(t *testing.T) {
		tok := cp.token(t, "--role", "worker", "--site", "rack1", "--require-approval")
		j := startJoin(t, m, tok)
		j.waitFor(t, regexp.MustCompile(`^bcd: waiting for the control plane's approval \(node \S+ waits for approval: fleetd nodes approve \S+\)`), 60*time.Second)
		node = approvePending(t, cp, m)
		j.waitFor(t, regexp.MustCompile(`^joined as `+regexp.QuoteMeta(node)+` \(site rack1, role worker\)`), 60*time.Second)
		if code := j.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("join exited %d:\n%s", code, j.log)
		}
		// The approval was followed by a fresh challenge round.
		if n := strings.Count(cp.log.String(), `msg="tpm challenge" round=1`); n < 2 {
			t.Errorf("%d challenge rounds, want one before and one after the approval:\n%s", n, cp.log)
		}
		show := run(t, "", nil, "fleetd", "nodes", "show", node, "--config", cp.config, "--json")
		if jsonField(show.stdout, "attestor") != "tpm" {
			t.Errorf("the approved node: %s", show.stdout)
		}
	})

	t.Run("a token piped with a known EK is spent and gives its role and site", func(t *testing.T) {
		tok := cp.token(t, "--role", "gpu", "--site", "rack9")
		r := run(t, tok, m.env(), "bcd", "join", "--config", m.cfg, "--reset", "--yes")
		mm := joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout)))
		if r.code != 0 || mm == nil || mm[1] != node || mm[2] != "rack9" || mm[3] != "gpu" {
			t.Fatalf("a known EK with a new role's token: %s", r)
		}
		list := run(t, "", nil, "fleetd", "token", "list", "--config", cp.config, "--json")
		used := 0
		for _, u := range tokenUsedRE.FindAllStringSubmatch(list.stdout, -1) {
			if u[1] == node {
				used++
			}
		}
		if used != 2 {
			t.Errorf("%d tokens used by %s, want 2 (the approval's and the piped one):\n%s", used, node, list.stdout)
		}
		// The spent token does not work again, not even with the EK.
		r = run(t, tok, m.env(), "bcd", "join", "--config", m.cfg, "--reset", "--yes")
		assertRefused(t, r)
		if !strings.Contains(cp.log.String(), "token already used by node "+node) {
			t.Errorf("the server did not log why:\n%s", cp.log)
		}
	})

	t.Run("without a token the EK keeps the node's role and site", func(t *testing.T) {
		r := run(t, "", m.env(), "bcd", "join", "--config", m.cfg, "--reset", "--yes")
		mm := joinedRE.FindStringSubmatch(strings.TrimPrefix(r.stdout, movedLines(r.stdout)))
		if r.code != 0 || mm == nil || mm[1] != node || mm[2] != "rack9" || mm[3] != "gpu" {
			t.Fatalf("a known EK without a token: %s", r)
		}
	})
}
