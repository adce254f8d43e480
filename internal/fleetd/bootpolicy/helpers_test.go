package bootpolicy_test

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/pki/pkitest"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// fixture is a small Secure Boot world: platform and exchange keys, db
// authorities for the install environment (HookOS), the installed OS
// (Talos) and one the policies do not know, the images they sign, and a
// policy directory with one policy per class.
type fixture struct {
	dir                     string
	pk, kek                 *pkitest.CA
	hookos, talos, rogue    *pkitest.CA
	shim, kernel, installer []byte // Authenticode digests
	unknownKernel, dbxHash  []byte
	policies                *bootpolicy.Policies
}

func digestOf(s string) []byte {
	d := sha256.Sum256([]byte(s))
	return d[:]
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{
		dir: t.TempDir(),
		pk:  pkitest.NewCA(t, "Test Platform Key"), kek: pkitest.NewCA(t, "Test KEK"),
		hookos: pkitest.NewCA(t, "HookOS Secure Boot Signing"), talos: pkitest.NewCA(t, "Talos Secure Boot Signing"),
		rogue: pkitest.NewCA(t, "Someone Else's Signing Key"),
		shim:  digestOf("shimx64.efi 15.8"), kernel: digestOf("talos-uki v1.11.5"), installer: digestOf("hookos-uki v0.10"),
		unknownKernel: digestOf("talos-uki v1.9.0"), dbxHash: digestOf("a revoked image"),
	}
	if err := os.Mkdir(filepath.Join(f.dir, "certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(f.dir, "certs", "talos.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.talos.Cert.Raw}))
	hookosSum := sha256.Sum256(f.hookos.Cert.Raw)
	writeFile(t, filepath.Join(f.dir, "worker.toml"), []byte(`class = "worker"
description = "Talos workers"
secure_boot = true
intake_required_authorities = ["HookOS"]
renew_required_authorities = ["Talos"]

[[allowed_authorities]]
name = "Talos"
file = "certs/talos.pem"

[[allowed_authorities]]
name = "HookOS"
sha256 = "`+hex.EncodeToString(hookosSum[:])+`"

[[boot_applications]]
name = "shim 15.8"
sha256 = "`+hex.EncodeToString(f.shim)+`"

[[boot_applications]]
name = "Talos v1.11.5 UKI"
sha256 = "sha256:`+hex.EncodeToString(f.kernel)+`"
`))
	writeFile(t, filepath.Join(f.dir, "control-plane.toml"), []byte(`class = "control-plane"
secure_boot = true
renew_required_authorities = []
boot_applications = []

[[allowed_authorities]]
name = "Talos"
file = "certs/talos.pem"
`))
	writeFile(t, filepath.Join(f.dir, "install.toml"), []byte(`class = "install"
secure_boot = true
intake_required_authorities = ["HookOS"]

[[allowed_authorities]]
name = "HookOS"
sha256 = "`+hex.EncodeToString(hookosSum[:])+`"
`))
	writeFile(t, filepath.Join(f.dir, "lab.toml"), []byte(`class = "lab"
secure_boot = false
`))
	// Not a policy: ignored.
	writeFile(t, filepath.Join(f.dir, "README"), []byte("policies for the test fleet\n"))
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: f.dir, Now: func() time.Time { return time.Unix(1_800_000_000, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	f.policies = ps
	return f
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// app is a boot application of a test boot: its digest, and the db
// authority that verified it (nil: none logged before it).
type app struct {
	by     *pkitest.CA
	digest []byte
	path   string
}

// boot is the log of a UEFI boot: the CRTM version in PCR 0, the Secure
// Boot variables (db holding HookOS's, Talos's and the rogue's
// certificates), separators in PCRs 0–7, then each boot application in
// PCR 4, after the authority that verified it in PCR 7.
func (f *fixture) boot(secureBoot bool, apps ...app) *tpmtest.EventLog {
	l := &tpmtest.EventLog{}
	l.Add(tpmtest.Event{PCR: 0, Type: tpmtest.EvSCRTMVersion, Data: []byte("1.0\x00")})
	l.SecureBootVariables(secureBoot, []*x509.Certificate{f.pk.Cert}, []*x509.Certificate{f.kek.Cert},
		[]*x509.Certificate{f.hookos.Cert, f.talos.Cert, f.rogue.Cert}, [][]byte{f.dbxHash})
	l.Add(tpmtest.Event{PCR: 4, Type: tpmtest.EvEFIAction, Data: []byte("Calling EFI Application from Boot Option")})
	l.Separators(0, 1, 2, 3, 4, 5, 6, 7)
	for _, a := range apps {
		if a.by != nil {
			l.Authority(a.by.Cert)
		}
		l.BootApplication(a.digest, a.path)
	}
	return l
}

// without returns l without its events on pcr.
func without(l *tpmtest.EventLog, pcr int) *tpmtest.EventLog {
	out := &tpmtest.EventLog{}
	for _, e := range l.Events {
		if e.PCR != pcr {
			out.Add(e)
		}
	}
	return out
}

// talosBoot is a worker's boot after installation: shim verified by the
// Talos key, then the Talos UKI.
func (f *fixture) talosBoot() *tpmtest.EventLog {
	return f.boot(true, app{f.talos, f.shim, `\EFI\BOOT\BOOTX64.EFI`}, app{nil, f.kernel, `\EFI\Linux\talos.efi`})
}

// policyCase is one boot evaluated against one class's policy: measured
// is what the TPM saw (extended and quoted), log what the node sends
// (measured's own log when nil).
type policyCase struct {
	name     string
	class    string
	stage    bootpolicy.Stage
	measured *tpmtest.EventLog
	log      []byte
	failed   []string // the rules that must fail; none: the verdict passes
	detail   string   // in the first failed rule's detail, or in a note of a passing verdict
}

// policyCases has, for every rule, a boot that passes it and one that
// fails it.
func (f *fixture) policyCases() []policyCase {
	talos := f.talosBoot()
	extra := f.talosBoot()
	extra.BootApplication(f.unknownKernel, `\EFI\Linux\old.efi`)
	hookosBoot := f.boot(true, app{f.hookos, f.installer, `\EFI\BOOT\BOOTX64.EFI`})
	return []policyCase{
		{name: "a pinned Talos boot passes at renewal", class: "worker", stage: bootpolicy.Renewal, measured: talos},
		{name: "the same boot passes the hourly boot check", class: "worker", stage: bootpolicy.BootCheck, measured: talos},
		{name: "event_log: a log missing a measured boot application fails", class: "worker", stage: bootpolicy.Renewal,
			measured: extra, log: talos.Bytes(),
			failed: []string{"event_log", "secure_boot", "allowed_authorities", "renew_required_authorities", "boot_applications"}, detail: "PCRs [4]"},
		{name: "event_log: a log stripped of PCR 4 while the TPM measured it fails", class: "worker", stage: bootpolicy.Renewal,
			measured: talos, log: without(talos, 4).Bytes(),
			failed: []string{"event_log", "secure_boot", "allowed_authorities", "renew_required_authorities", "boot_applications"}, detail: "PCR 4 has no event"},
		{name: "secure_boot: Secure Boot off fails, and so does the missing renewal authority", class: "worker", stage: bootpolicy.Renewal,
			measured: f.boot(false, app{nil, f.shim, ""}, app{nil, f.kernel, ""}),
			failed:   []string{"secure_boot", "renew_required_authorities"}, detail: "Secure Boot is off"},
		{name: "secure_boot: not required by the lab class", class: "lab", stage: bootpolicy.Renewal,
			measured: f.boot(false, app{nil, f.shim, ""}), detail: "renew_required_authorities is empty"},
		{name: "allowed_authorities: an unknown signing authority fails", class: "worker", stage: bootpolicy.Renewal,
			measured: f.boot(true, app{f.talos, f.shim, ""}, app{f.rogue, f.kernel, ""}),
			failed:   []string{"allowed_authorities"}, detail: "Someone Else's Signing Key"},
		{name: "intake_required_authorities: the install environment's boot passes at intake", class: "install", stage: bootpolicy.Intake,
			measured: hookosBoot, detail: "boot_applications is empty"},
		{name: "intake_required_authorities: a boot without HookOS fails at intake", class: "worker", stage: bootpolicy.Intake,
			measured: talos, failed: []string{"intake_required_authorities"}, detail: "HookOS"},
		{name: "renew_required_authorities: a boot without Talos fails at renewal", class: "worker", stage: bootpolicy.Renewal,
			measured: f.boot(true, app{f.hookos, f.shim, ""}, app{nil, f.kernel, ""}),
			failed:   []string{"renew_required_authorities"}, detail: "Talos"},
		{name: "boot_applications: an image that is not pinned fails", class: "worker", stage: bootpolicy.Renewal,
			measured: f.boot(true, app{f.talos, f.shim, ""}, app{nil, f.unknownKernel, `\EFI\Linux\old.efi`}),
			failed:   []string{"boot_applications"}, detail: `\EFI\Linux\old.efi`},
		{name: "boot_applications: a boot with nothing in PCR 4 fails a pinned class", class: "worker", stage: bootpolicy.Renewal,
			measured: without(talos, 4), failed: []string{"boot_applications"}, detail: "stripped of PCR 4"},
		{name: "boot_applications: an empty list pins nothing, and the verdict says so", class: "control-plane", stage: bootpolicy.Renewal,
			measured: f.boot(true, app{f.talos, f.unknownKernel, ""}), detail: "no exact image is pinned"},
	}
}

// checkVerdict checks v against c: every rule listed, exactly c.failed
// failing, and c.detail where the case says.
func checkVerdict(t *testing.T, c policyCase, v *bootpolicy.Verdict) {
	t.Helper()
	if v.Class != c.class || v.Stage != c.stage || !strings.HasPrefix(v.Policy, "sha256:") {
		t.Errorf("verdict for class %q stage %q policy %q", v.Class, v.Stage, v.Policy)
	}
	if len(v.Rules) != 5 {
		t.Errorf("%d rules, want 5: %+v", len(v.Rules), v.Rules)
	}
	if !slices.Equal(v.Failed, c.failed) {
		t.Fatalf("failed rules %v, want %v; rules %+v", v.Failed, c.failed, v.Rules)
	}
	if v.Pass() != (len(c.failed) == 0) || (v.Result == "pass") != v.Pass() {
		t.Fatalf("result %q with failed rules %v", v.Result, v.Failed)
	}
	if c.detail == "" {
		return
	}
	where := strings.Join(v.Notes, "\n")
	if len(c.failed) > 0 {
		for _, r := range v.Rules {
			if r.Rule == c.failed[0] {
				where = r.Detail
			}
		}
	}
	if !strings.Contains(where, c.detail) {
		t.Errorf("%q does not mention %q", where, c.detail)
	}
}

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }
