package command

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
