package command

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/pki/pkitest"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// policyDir writes a worker policy that allows the Talos key and pins
// shim and the kernel, and the fleetd.toml naming it.
func policyDir(t *testing.T, talos *pkitest.CA, pins ...[]byte) (dir, configPath string) {
	t.Helper()
	dir = t.TempDir()
	sum := sha256.Sum256(talos.Cert.Raw)
	p := fmt.Sprintf("class = \"worker\"\nsecure_boot = true\n[[allowed_authorities]]\nname = \"Talos\"\nsha256 = %q\n", hex.EncodeToString(sum[:]))
	for i, d := range pins {
		p += fmt.Sprintf("[[boot_applications]]\nname = \"image %d\"\nsha256 = %q\n", i, hex.EncodeToString(d))
	}
	write(t, filepath.Join(dir, "policies", "worker.toml"), p)
	configPath = filepath.Join(dir, "fleetd.toml")
	write(t, configPath, "pki_dir = \"pki\"\ndata_dir = \"data\"\n[boot_policy]\ndir = \"policies\"\n")
	return dir, configPath
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// talosBoot is a Secure Boot log: shim verified by talos, then a kernel.
func talosBoot(t *testing.T, talos *pkitest.CA, shim, kernel []byte) *tpmtest.EventLog {
	pk := pkitest.NewCA(t, "Test Platform Key")
	l := &tpmtest.EventLog{}
	l.SecureBootVariables(true, []*x509.Certificate{pk.Cert}, []*x509.Certificate{pk.Cert}, []*x509.Certificate{talos.Cert}, nil)
	l.Separators(0, 1, 2, 3, 4, 5, 6, 7)
	l.Authority(talos.Cert)
	l.BootApplication(shim, `\EFI\BOOT\BOOTX64.EFI`)
	l.BootApplication(kernel, `\EFI\Linux\talos.efi`)
	return l
}

// pcrFile writes PCR values as tpm2_pcrread prints them.
func pcrFile(t *testing.T, path string, pcrs map[int][]byte) {
	t.Helper()
	var b strings.Builder
	b.WriteString("  sha256:\n")
	for i := range 8 {
		fmt.Fprintf(&b, "    %d : 0x%X\n", i, pcrs[i])
	}
	write(t, path, b.String())
}

// TestPolicyCheck runs fleetd policy check on a captured boot: a pass, a
// failure naming its rule (exit 1), JSON, and the mistakes it refuses.
func TestPolicyCheck(t *testing.T) {
	talos := pkitest.NewCA(t, "Talos Secure Boot Signing")
	shim, kernel, other := digest("shim"), digest("kernel v1"), digest("kernel v0")
	dir, configPath := policyDir(t, talos, shim, kernel)
	boot := talosBoot(t, talos, shim, kernel)
	logPath, pcrsPath := filepath.Join(dir, "boot.log"), filepath.Join(dir, "pcrs.txt")
	write(t, logPath, string(boot.Bytes()))
	pcrFile(t, pcrsPath, boot.PCRs())

	out, errOut, code := run(t, "policy", "check", "--config", configPath, "--class", "worker", "--log", logPath, "--pcrs", pcrsPath)
	if code != 0 || !strings.Contains(out, "PASS") || !strings.Contains(out, "[image 1]") || !strings.Contains(out, `\EFI\Linux\talos.efi`) {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}

	old := talosBoot(t, talos, shim, other)
	oldLog := filepath.Join(dir, "old.log")
	write(t, oldLog, string(old.Bytes()))
	pcrFile(t, pcrsPath, old.PCRs())
	out, _, code = run(t, "policy", "check", "--dir", filepath.Join(dir, "policies"), "--class", "worker", "--log", oldLog, "--pcrs", pcrsPath)
	if code != cli.ExitFailure || !strings.Contains(out, "FAIL: boot_applications") || !strings.Contains(out, hex.EncodeToString(other)) {
		t.Fatalf("an unpinned kernel: exit %d\n%s", code, out)
	}
	out, _, code = run(t, "policy", "check", "--dir", filepath.Join(dir, "policies"), "--class", "worker", "--log", oldLog, "--pcrs", pcrsPath, "--json", "--stage", "boot-check")
	var v bootpolicy.Verdict
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != 1 || v.Stage != bootpolicy.BootCheck || strings.Join(v.Failed, ",") != "boot_applications" {
		t.Fatalf("--json: exit %d, %v, %+v", code, err, v)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no class", []string{"--config", configPath, "--log", logPath, "--pcrs", pcrsPath}, cli.ExitUsage, "needs --class"},
		{"an unknown stage", []string{"--config", configPath, "--class", "worker", "--log", logPath, "--pcrs", pcrsPath, "--stage", "boot"}, cli.ExitUsage, "--stage"},
		{"a class without a policy", []string{"--config", configPath, "--class", "gpu", "--log", logPath, "--pcrs", pcrsPath}, cli.ExitFailure, `no boot policy for this machine class: "gpu"`},
		{"PCR values that are not", []string{"--config", configPath, "--class", "worker", "--log", logPath, "--pcrs", logPath}, cli.ExitFailure, "boot.log"},
		{"a policy directory that does not load", []string{"--dir", dir, "--class", "worker", "--log", logPath, "--pcrs", pcrsPath}, cli.ExitFailure, "invalid boot policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, append([]string{"policy", "check"}, tc.args...)...)
			if code != tc.code || !strings.Contains(errOut, tc.want) || out != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d mentioning %q", code, out, errOut, tc.code, tc.want)
			}
		})
	}
}

// TestPolicyCheckSwtpm captures a boot as docs/boot-policy.md says: the
// boot is measured into swtpm, tpm2_pcrread reads its PCRs (SHA-1 bank first, then all 24 SHA-256 PCRs), and fleetd
// policy check evaluates them with the log. It skips when swtpm or
// tpm2-tools is missing (and fails under CI).
func TestPolicyCheckSwtpm(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	talos := pkitest.NewCA(t, "Talos Secure Boot Signing")
	shim, kernel := digest("shim"), digest("kernel v1")
	dir, configPath := policyDir(t, talos, shim, kernel)
	boot := talosBoot(t, talos, shim, kernel)
	sw.ExtendLog(t, boot)
	cmd := exec.Command("tpm2_pcrread", "sha1:0,1,2,3,4,5,6,7+sha256:all")
	cmd.Env = append(os.Environ(), fmt.Sprintf("TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=%d", sw.Port))
	pcrs, err := cmd.Output()
	if err != nil {
		t.Fatalf("tpm2_pcrread: %v", err)
	}
	logPath, pcrsPath := filepath.Join(dir, "boot.log"), filepath.Join(dir, "pcrs.txt")
	write(t, logPath, string(boot.Bytes()))
	write(t, pcrsPath, string(pcrs))
	out, errOut, code := run(t, "policy", "check", "--config", configPath, "--class", "worker", "--log", logPath, "--pcrs", pcrsPath)
	if code != 0 || !strings.Contains(out, "PASS") {
		t.Fatalf("exit %d\n%s%s\ntpm2_pcrread printed:\n%s", code, out, errOut, pcrs)
	}
}

func digest(s string) []byte {
	d := sha256.Sum256([]byte(s))
	return d[:]
}

func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errw bytes.Buffer
	err := Execute(context.Background(), args, &out, &errw)
	code = cli.Main("fleetd", err, &errw)
	return out.String(), errw.String(), code
}

// TestPolicyCaptureStatusPromote captures a policy from a golden boot with
// the command, checks the golden boot passes and a boot with another
// kernel fails it, adds a [next] state for that kernel, counts a verdict
// log with policy status, and promotes.
func TestPolicyCaptureStatusPromote(t *testing.T) {
	talos := pkitest.NewCA(t, "Talos Secure Boot Signing")
	shim, kernel, newKernel := digest("shim"), digest("kernel v1"), digest("kernel v2")
	dir, configPath := policyDir(t, talos, shim, kernel)
	boot := talosBoot(t, talos, shim, kernel)
	logPath, pcrsPath := filepath.Join(dir, "boot.log"), filepath.Join(dir, "pcrs.txt")
	write(t, logPath, string(boot.Bytes()))
	pcrFile(t, pcrsPath, boot.PCRs())
	policies := filepath.Join(dir, "policies")
	if err := os.Remove(filepath.Join(policies, "worker.toml")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(policies, "worker.toml")
	// PCR 7 is left out: each talosBoot has a platform key of its own.
	stdout, errOut, code := run(t, "policy", "capture", "--class", "worker", "--log", logPath, "--pcrs", pcrsPath, "--out", out, "--description", "golden worker", "--pin-pcrs", "0,2")
	if code != 0 || !strings.Contains(stdout, "the machine passes it") {
		t.Fatalf("capture: exit %d\n%s%s", code, stdout, errOut)
	}
	if _, errOut, code = run(t, "policy", "capture", "--class", "worker", "--log", logPath, "--pcrs", pcrsPath, "--out", out); code != cli.ExitFailure || !strings.Contains(errOut, "exists") {
		t.Fatalf("capture over an existing file: exit %d, %s", code, errOut)
	}
	if stdout, _, code = run(t, "policy", "capture", "--class", "worker", "--log", logPath, "--pcrs", pcrsPath, "--pin-pcrs", ""); code != 0 || strings.Contains(stdout, "[[pcr_values]]") || !strings.Contains(stdout, `class = "worker"`) {
		t.Fatalf("capture to stdout without pinned PCRs: exit %d\n%s", code, stdout)
	}
	if stdout, errOut, code = run(t, "policy", "check", "--config", configPath, "--class", "worker", "--log", logPath, "--pcrs", pcrsPath); code != 0 {
		t.Fatalf("the golden boot against its capture: exit %d\n%s%s", code, stdout, errOut)
	}
	next := talosBoot(t, talos, shim, newKernel)
	nextLog := filepath.Join(dir, "next.log")
	write(t, nextLog, string(next.Bytes()))
	nextPCRs := filepath.Join(dir, "next-pcrs.txt")
	pcrFile(t, nextPCRs, next.PCRs())
	if stdout, _, code = run(t, "policy", "check", "--config", configPath, "--class", "worker", "--log", nextLog, "--pcrs", nextPCRs); code != cli.ExitFailure || !strings.Contains(stdout, "FAIL: boot_applications") {
		t.Fatalf("another kernel against the capture: exit %d\n%s", code, stdout)
	}

	// A [next] state for the new kernel, open now.
	captured, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	withNext := string(captured) + fmt.Sprintf("\n[next]\nnot_before = %s\nnot_after = %s\n[[next.boot_applications]]\nname = \"shim\"\nsha256 = %q\n[[next.boot_applications]]\nname = \"kernel v2\"\nsha256 = %q\n",
		now.Add(-time.Hour).Format(time.RFC3339), now.Add(time.Hour).Format(time.RFC3339), hex.EncodeToString(shim), hex.EncodeToString(newKernel))
	write(t, out, withNext)
	stdout, _, code = run(t, "policy", "check", "--config", configPath, "--class", "worker", "--log", nextLog, "--pcrs", nextPCRs, "--json")
	var v bootpolicy.Verdict
	if err := json.Unmarshal([]byte(stdout), &v); err != nil || code != 0 || v.Matched != bootpolicy.MatchedNext {
		t.Fatalf("the next kernel inside the window: exit %d, %v, matched %q", code, err, v.Matched)
	}

	// policy status over a verdict log.
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	vl, err := bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range []string{bootpolicy.MatchedCurrent, bootpolicy.MatchedNext, bootpolicy.MatchedNext} {
		if err := vl.Append(&bootpolicy.Verdict{NodeID: fmt.Sprint("n", i), Class: "worker", Result: "pass", Matched: m, Time: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := vl.Close(); err != nil {
		t.Fatal(err)
	}
	stdout, errOut, code = run(t, "policy", "status", "--local", "--config", configPath, "--json")
	var st []bootpolicy.ClassStatus
	if err := json.Unmarshal([]byte(stdout), &st); err != nil || code != 0 || len(st) != 1 || st[0].Current != 1 || st[0].Next != 2 {
		t.Fatalf("status: exit %d, %v, %+v\n%s", code, err, st, errOut)
	}

	stdout, errOut, code = run(t, "policy", "promote", "--config", configPath, "--class", "worker")
	if code != 0 || !strings.Contains(stdout, "previous file kept as") {
		t.Fatalf("promote: exit %d\n%s%s", code, stdout, errOut)
	}
	if _, _, code = run(t, "policy", "check", "--config", configPath, "--class", "worker", "--log", logPath, "--pcrs", pcrsPath); code != cli.ExitFailure {
		t.Fatal("the old kernel passes after promotion")
	}
	if _, errOut, code = run(t, "policy", "promote", "--config", configPath, "--class", "worker"); code != cli.ExitFailure || !strings.Contains(errOut, "no [next] state") {
		t.Fatalf("a second promote: exit %d, %s", code, errOut)
	}
}

// TestEKRootsCheck runs fleetd ek-roots check on a good bundle (exit 0)
// and on one holding an EK certificate (exit 1).
func TestEKRootsCheck(t *testing.T) {
	dir := t.TempDir()
	root := tpmtest.NewManufacturer(t, "Vendor Root", nil)
	inter := tpmtest.NewManufacturer(t, "Vendor EK CA", root)
	pemOf := func(c *x509.Certificate) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	write(t, filepath.Join(dir, "root.pem"), pemOf(root.Cert))
	write(t, filepath.Join(dir, "ek-ca.pem"), pemOf(inter.Cert))
	out, errOut, code := run(t, "ek-roots", "check", dir)
	if code != 0 || !strings.Contains(out, "1 roots, 1 intermediates, 0 errors") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	ek, err := x509.ParseCertificate(inter.EKCert(t, root.Key.Public(), tpmtest.EKCertOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "ek.pem"), pemOf(ek))
	out, _, code = run(t, "ek-roots", "check", dir)
	if code != cli.ExitFailure || !strings.Contains(out, "ERROR: ek.pem") {
		t.Fatalf("an EK certificate in the bundle: exit %d\n%s", code, out)
	}
	if _, _, code = run(t, "ek-roots", "check"); code != cli.ExitUsage {
		t.Fatalf("no folder: exit %d", code)
	}
}

// TestPolicyCaptureFromKeptEvidence turns the server's record of a node's
// evidence into a capture: a passing record captures a policy it passes;
// a failed one captures too, with a note; a quote that does not cover
// the PCR values refuses; and the flags take --node or --log and --pcrs.
func TestPolicyCaptureFromKeptEvidence(t *testing.T) {
	talos := pkitest.NewCA(t, "Talos Secure Boot Signing")
	boot := talosBoot(t, talos, digest("shim"), digest("kernel v1"))
	kept := &adminv1.BootEvidence{NodeId: "web-01", TimeUnixNano: time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC).UnixNano(),
		Stage: "boot-check", Class: "worker", Passed: true, Pcrs: map[uint32][]byte{}, EventLog: boot.Bytes()}
	for i, v := range boot.PCRs() {
		kept.Pcrs[uint32(i)] = v
	}
	var notes bytes.Buffer
	ev, err := fromKept(&notes, "web-01", kept)
	if err != nil || ev.Quote != nil || notes.Len() != 0 {
		t.Fatalf("fromKept = %+v, %v, notes %q", ev, err, notes.String())
	}
	content, v, err := bootpolicy.Capture(bootpolicy.CaptureOptions{Class: "worker", EventLog: ev.EventLog, PCRs: ev.PCRs, Quote: ev.Quote, Source: ev.source})
	if err != nil || !v.Pass() {
		t.Fatalf("capture from kept evidence: %v", err)
	}
	if !strings.Contains(string(content), "from node web-01's last verified boot evidence (boot-check at 2026-12-02T06:00:00Z; it got pass under class worker).") {
		t.Errorf("the header does not name the evidence:\n%s", content)
	}

	kept.Passed = false
	if _, err := fromKept(&notes, "web-01", kept); err != nil || !strings.Contains(notes.String(), "failed its class worker policy") {
		t.Errorf("a failed record: %v, notes %q", err, notes.String())
	}
	kept.QuoteAttest, kept.QuoteSignature, kept.AkPublic, kept.Nonce = []byte("not a quote"), []byte("sig"), []byte("ak"), []byte("nonce")
	ev, err = fromKept(&notes, "web-01", kept)
	if err != nil || ev.Quote == nil {
		t.Fatalf("fromKept with a quote = %+v, %v", ev, err)
	}
	if _, _, err := bootpolicy.Capture(bootpolicy.CaptureOptions{Class: "worker", EventLog: ev.EventLog, PCRs: ev.PCRs, Quote: ev.Quote}); !errors.Is(err, bootpolicy.ErrUnproven) {
		t.Errorf("capture with a quote that does not verify: %v, want ErrUnproven", err)
	}
	if _, err := fromKept(&notes, "web-01", nil); err == nil {
		t.Error("fromKept of no evidence succeeded")
	}

	for _, args := range [][]string{
		{"policy", "capture", "--class", "worker", "--node", "web-01", "--log", "boot.log", "--pcrs", "pcrs.txt"},
		{"policy", "capture", "--class", "worker"},
		{"policy", "capture", "--node", "web-01"},
	} {
		if _, errOut, code := run(t, args...); code != cli.ExitUsage {
			t.Errorf("%v: exit %d, %s; want a usage error", args, code, errOut)
		}
	}
}
