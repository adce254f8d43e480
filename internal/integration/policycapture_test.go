package integration

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/pki/pkitest"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// fleetd policy capture --node and policy status against the real
// binaries and swtpm (issue 21): a machine measures a Secure Boot chain
// into its TPM and joins by tpm with its log; fleetd keeps that evidence,
// and the policy captured from it accepts the machine's boot and refuses
// the same boot with another kernel.

// securedBoot is a Secure Boot log: shim and kernel verified by signer,
// under the platform key pk.
func securedBoot(pk, signer *pkitest.CA, shim, kernel string) *tpmtest.EventLog {
	l := &tpmtest.EventLog{}
	l.SecureBootVariables(true, []*x509.Certificate{pk.Cert}, []*x509.Certificate{pk.Cert}, []*x509.Certificate{signer.Cert}, nil)
	l.Separators(0, 1, 2, 3, 4, 5, 6, 7)
	l.Authority(signer.Cert)
	s, k := sha256.Sum256([]byte(shim)), sha256.Sum256([]byte(kernel))
	l.BootApplication(s[:], `\EFI\BOOT\BOOTX64.EFI`)
	l.BootApplication(k[:], `\EFI\Linux\talos.efi`)
	return l
}

// writeEvidence writes l and its PCR values (as tpm2_pcrread prints them)
// into dir, and returns their paths.
func writeEvidence(t *testing.T, dir, name string, l *tpmtest.EventLog) (logPath, pcrsPath string) {
	t.Helper()
	logPath, pcrsPath = filepath.Join(dir, name+".log"), filepath.Join(dir, name+".pcrs")
	var b strings.Builder
	b.WriteString("sha256:\n")
	pcrs := l.PCRs()
	for i := range 8 {
		fmt.Fprintf(&b, "  %d : 0x%X\n", i, pcrs[i])
	}
	if err := os.WriteFile(logPath, l.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pcrsPath, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return logPath, pcrsPath
}

func TestPolicyCaptureFromANodeAndStatusFromTheStore(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	signer, pk := pkitest.NewCA(t, "Talos Secure Boot Signing"), pkitest.NewCA(t, "Test Platform Key")
	golden := securedBoot(pk, signer, "shim 15.8", "talos v1.11.5")
	sw.ExtendLog(t, golden)
	files := t.TempDir()
	goldenLog, goldenPCRs := writeEvidence(t, files, "golden", golden)
	otherLog, otherPCRs := writeEvidence(t, files, "other", securedBoot(pk, signer, "shim 15.8", "talos v1.12.0"))

	// A loose first worker policy: any boot the signer verified.
	policies := t.TempDir()
	for class, body := range map[string]string{
		"worker":              fmt.Sprintf("class = \"worker\"\nsecure_boot = false\n[[allowed_authorities]]\nname = \"Talos\"\nsha256 = \"%x\"\n", sha256.Sum256(signer.Cert.Raw)),
		"control-plane":       "class = \"control-plane\"\nsecure_boot = false\n",
		"install-environment": "class = \"install-environment\"\nsecure_boot = false\n",
	} {
		if err := os.WriteFile(filepath.Join(policies, class+".toml"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cp := startControlPlane(t, ekRootsConfig(t, sw)+fmt.Sprintf("[boot_policy]\ndir = %q\nboot_check_timeout = \"5s\"\n", policies))
	m := tpmMachine(t, cp, uuid1, sw, "[boot_check]\nevent_log = \""+goldenLog+"\"\n")
	node := joinedAs(t, tpmJoin(t, m, cp.token(t, "--role", "worker"), false))

	declarer, auditor := cp.credential(t, "dora", "declarer"), cp.credential(t, "audra", "auditor")
	captured := filepath.Join(t.TempDir(), "worker.toml")
	if r := cp.fleetd(t, declarer, "policy", "capture", "--node", node, "--class", "worker", "--out", captured); r.code == 0 || !strings.Contains(r.stderr, "PermissionDenied") {
		t.Errorf("a declarer's capture: %s", r)
	}
	if r := cp.fleetd(t, auditor, "policy", "capture", "--node", "no-such-node", "--class", "worker"); r.code == 0 || !strings.Contains(r.stderr, "no boot evidence of node no-such-node is kept") {
		t.Errorf("capture of an unknown node: %s", r)
	}
	r := cp.fleetd(t, auditor, "policy", "capture", "--node", node, "--class", "worker", "--out", captured)
	if r.code != 0 || !strings.Contains(r.stdout, "the machine passes it") {
		t.Fatalf("capture --node: %s", r)
	}
	content, err := os.ReadFile(captured)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(content), "from node "+node+"'s last verified boot evidence (intake at ") || !strings.Contains(string(content), "secure_boot = true") {
		t.Errorf("the captured policy:\n%s", content)
	}

	// The captured policy accepts the machine's boot and refuses the same
	// boot with another kernel.
	dir := filepath.Dir(captured)
	if r := cp.fleetd(t, "", "policy", "check", "--dir", dir, "--class", "worker", "--log", goldenLog, "--pcrs", goldenPCRs); r.code != 0 || !strings.Contains(r.stdout, "PASS") {
		t.Errorf("the golden boot against its capture: %s", r)
	}
	if r := cp.fleetd(t, "", "policy", "check", "--dir", dir, "--class", "worker", "--log", otherLog, "--pcrs", otherPCRs); r.code != 1 || !strings.Contains(r.stdout, "FAIL: boot_applications\n") {
		t.Errorf("another kernel against the capture: %s", r)
	}

	// policy status counts the store's verdicts: the join's was judged
	// before the node had an id, so the node counts from its boot check.
	a := startAgent(t, m)
	a.waitFor(t, sessionOpenRE, 30*time.Second)
	cp.mustFleetd(t, "", "nodes", "check", node)
	var st []struct {
		Class   string `json:"class"`
		Nodes   int    `json:"nodes"`
		Current int    `json:"current"`
		Next    int    `json:"next"`
		Failing int    `json:"failing"`
	}
	out := cp.mustFleetd(t, auditor, "policy", "status", "--json").stdout
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st) != 1 || st[0].Class != "worker" || st[0].Nodes != 1 || st[0].Current != 1 {
		t.Fatalf("policy status: %v\n%s", err, out)
	}
	if v := cp.mustFleetd(t, "", "nodes", "verdicts", node, "--json").stdout; !strings.Contains(v, `"matched": "current"`) {
		t.Errorf("the stored verdict does not say which state it matched:\n%s", v)
	}
}
