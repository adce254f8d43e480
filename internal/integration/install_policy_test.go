package integration

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/bcd/passmarker"
	"github.com/nodetrust/nodetrust/internal/fleetd/install"
	"github.com/nodetrust/nodetrust/internal/fleetd/inventory/netbox/netboxfake"
	"github.com/nodetrust/nodetrust/internal/fleetd/provision"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki/pkitest"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// installPolicies writes the boot policies of the three default classes:
// the install environment's requires Secure Boot and that the install
// environment's signer (hookos) verified what it booted at intake; it also
// allows the installed system's signer (talos), so that a boot it alone
// verified fails that one rule. It returns the fleetd.toml lines.
func installPolicies(t *testing.T, hookos, talos *pkitest.CA) string {
	t.Helper()
	dir := t.TempDir()
	for class, body := range map[string]string{
		"install-environment": "class = \"install-environment\"\nsecure_boot = true\nintake_required_authorities = [\"HookOS\"]\nrenew_required_authorities = []\n" +
			fmt.Sprintf("[[allowed_authorities]]\nname = \"HookOS\"\nsha256 = \"%x\"\n", sha256.Sum256(hookos.Cert.Raw)) +
			fmt.Sprintf("[[allowed_authorities]]\nname = \"Talos\"\nsha256 = \"%x\"\n", sha256.Sum256(talos.Cert.Raw)),
		"worker":        "class = \"worker\"\nsecure_boot = false\n",
		"control-plane": "class = \"control-plane\"\nsecure_boot = false\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, class+".toml"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf("[boot_policy]\ndir = %q\nboot_check_timeout = \"5s\"\n", dir)
}

// installDecl2 declares web-01 (bound to pin1) and web-02 (bound to
// pin2) complete, both workers cabled to port nt-swp1 of sw-01.
func installDecl2(pin1, pin2 string) string {
	var b strings.Builder
	b.WriteString("version: 1\nnodes:\n")
	for _, n := range []struct{ name, uuid, pin string }{{"web-01", uuid1, pin1}, {"web-02", uuid2, pin2}} {
		fmt.Fprintf(&b, "  - name: %s\n    product_uuid: %s\n    class: worker\n    site: rack1\n", n.name, n.uuid)
		b.WriteString("    install_disk: /dev/sda\n    expected_port:\n      chassis: sw-01\n      port: nt-swp1\n")
		fmt.Fprintf(&b, "    ek_binding:\n      pins: [%q]\n      source: receiving-scan\n", n.pin)
	}
	return b.String()
}

// provisionRun is one run of the rendered provision script.
type provisionRun struct {
	status            int
	out               string
	wiped, configURL  string
	installerCodeFile string
}

// runProvision renders the provision script for web-01 with fleetd's
// HTTPS URL base, the gates' files marker and code, and a stand-in disk
// (a regular file), and runs it with bash: the wipe and the installer are
// scripts that record what they were given. The boot id is the kernel's
// own, the one bcd install wrote into the marker.
func runProvision(t *testing.T, base, marker, code string) provisionRun {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bash is missing: the provision script runs with it")
		}
		t.Skip("bash is not installed")
	}
	d := t.TempDir()
	disk, wiped, installed := filepath.Join(d, "disk.img"), filepath.Join(d, "wiped"), filepath.Join(d, "installed")
	for path, body := range map[string]string{
		disk:                          "old system",
		filepath.Join(d, "wipe"):      "#!/bin/sh\nprintf '%s\\n' \"$@\" >> '" + wiped + "'\n",
		filepath.Join(d, "installer"): "#!/bin/sh\nprintf '%s\\n%s\\n' \"$NODETRUST_CONFIG_URL\" \"$NODETRUST_INSTALL_CODE_FILE\" > '" + installed + "'\n",
	} {
		if err := os.WriteFile(path, []byte(body), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	script, err := provision.Render(provision.Params{Device: "web-01", ProductUUID: uuid1, Disk: disk, FleetdURL: base,
		PassMarker: marker, CodeFile: code, Installer: []string{filepath.Join(d, "installer")}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(d, "provision.sh")
	if err := os.WriteFile(path, script, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", path)
	cmd.Env = append(os.Environ(), "NODETRUST_WIPE_CMD="+filepath.Join(d, "wipe"))
	out, err := cmd.CombinedOutput()
	r := provisionRun{out: string(out)}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.status = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		return string(b)
	}
	r.wiped = read(wiped)
	if lines := strings.Split(strings.TrimSuffix(read(installed), "\n"), "\n"); len(lines) == 2 {
		r.configURL, r.installerCodeFile = lines[0], lines[1]
	}
	return r
}

// Seed 003 section 8's acceptance exercise under a real install-environment
// boot policy, on swtpm: web-01's TPM measured a Secure Boot whose boot
// applications the install environment's signer verified, so its intake
// passes the policy at the intake stage, and bcd install writes both the
// install code and the boot pass marker; the provision script rendered
// for web-01 wipes its (stand-in) disk with those two files and hands the
// installer the config URL, and the config is fetched once with the code.
// web-02's TPM measured a boot only the installed system's signer
// verified: its intake is refused, fleetd's log names the policy's rule
// intake_required_authorities, and it gets no code and no marker.
func TestInstallAcceptanceUnderTheInstallEnvironmentPolicy(t *testing.T) {
	hookos, talos, pk := pkitest.NewCA(t, "HookOS Secure Boot Signing"), pkitest.NewCA(t, "Talos Secure Boot Signing"), pkitest.NewCA(t, "Test Platform Key")
	sw1, sw2 := tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t)
	evidence := t.TempDir()
	boot1, boot2 := securedBoot(pk, hookos, "shim 15.8", "hookos v0.10.0"), securedBoot(pk, talos, "shim 15.8", "talos v1.11.5")
	sw1.ExtendLog(t, boot1)
	sw2.ExtendLog(t, boot2)
	log1, _ := writeEvidence(t, evidence, "web-01", boot1)
	log2, _ := writeEvidence(t, evidence, "web-02", boot2)

	tmpl := filepath.Join(t.TempDir(), "worker.tmpl")
	if err := os.WriteFile(tmpl, []byte(installTemplate), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t, "http_listen = \"127.0.0.1:0\"\n"+ekRootsConfig(t, sw1, sw2)+installPolicies(t, hookos, talos)+
		"[inventory]\nauto_provision = true\n"+
		fmt.Sprintf("[render.worker]\nkind = \"template\"\ntemplate = %q\n", tmpl))
	cp.apply(t, cp.credential(t, "alice", "declarer"), installDecl2(ekPin(t, sw1), ekPin(t, sw2)))
	client, base := cp.httpsClient(t)

	t.Run("a boot the install environment's signer verified installs and wipes", func(t *testing.T) {
		m := tpmMachine(t, cp, uuid1, sw1, fmt.Sprintf("[boot_check]\nevent_log = %q\n", log1))
		if r := run(t, "", m.env(), "bcd", "intake", "--config", m.cfg); r.code != 0 || !strings.Contains(r.stdout, "intake passed as web-01") {
			t.Fatalf("bcd intake: %s", r)
		}
		runDir := filepath.Join(t.TempDir(), "run")
		codeFile, marker := filepath.Join(runDir, "install-code"), filepath.Join(runDir, "boot-pass")
		r := runBCD(t, m, "install", "--config", m.cfg, "--lldp-file", lldpFile(t, "nt-swp1", time.Now()), "--code-file", codeFile, "--pass-marker", marker)
		if r.code != 0 || !strings.Contains(r.stdout, "install admitted as web-01") || !strings.Contains(r.stdout, "boot pass marker in "+marker) {
			t.Fatalf("bcd install: %s", r)
		}
		if !strings.Contains(cp.log.String(), "boot_verdict=pass") {
			t.Errorf("fleetd did not issue the code with a passed boot verdict:\n%s", tail(cp.log.String(), 20))
		}
		if n := cp.verdictCount(t, "web-01"); n != 1 {
			t.Errorf("%d verdicts of web-01, want its intake's", n)
		}
		// The marker is bcd's, for this device and this kernel's boot.
		b, err := os.ReadFile(marker)
		if err != nil {
			t.Fatal(err)
		}
		pm, err := passmarker.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		boot, err := passmarker.BootID("")
		if err != nil {
			t.Fatal(err)
		}
		if pm.UUID != uuid1 || pm.BootID != boot {
			t.Fatalf("the marker names device %s boot %s, want %s %s", pm.UUID, pm.BootID, uuid1, boot)
		}

		p := runProvision(t, base, marker, codeFile)
		if p.status != 0 || p.wiped == "" {
			t.Fatalf("the provision script with bcd's marker and code: status %d, wiped %q\n%s", p.status, p.wiped, p.out)
		}
		if want := base + install.ConfigPath(uuid1); p.configURL != want || p.installerCodeFile != codeFile {
			t.Errorf("the installer got URL %q and code file %q, want %q and %q", p.configURL, p.installerCodeFile, want, codeFile)
		}

		// The installer's fetch, with the code from the file it was given.
		b, err = os.ReadFile(codeFile)
		if err != nil {
			t.Fatal(err)
		}
		code := strings.TrimSpace(string(b))
		if strings.Contains(p.out, code) || strings.Contains(r.stdout+r.stderr, code) {
			t.Errorf("the install code was printed")
		}
		fetch := func() (int, string) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, p.configURL, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+code)
			rsp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer rsp.Body.Close()
			body, err := io.ReadAll(rsp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return rsp.StatusCode, string(body)
		}
		if st, body := fetch(); st != http.StatusOK || !strings.HasPrefix(body, "node=web-01 disk=/dev/sda\n") {
			t.Fatalf("fetch: %d %.40q", st, body)
		}
		cp.waitMetric(t, `nodetrust_config_activations_total{outcome="active"}`, 1)
		if got := cp.nodeState(t, "web-01"); got != store.StateActive {
			t.Errorf("web-01 is %s after the release, want active", got)
		}
		if st, _ := fetch(); st != http.StatusGone {
			t.Errorf("second fetch: %d, want 410 Gone", st)
		}
		if strings.Contains(cp.log.String(), code) {
			t.Errorf("fleetd's log holds the install code")
		}
	})

	t.Run("a boot without the install environment's signer is refused at intake", func(t *testing.T) {
		m := tpmMachine(t, cp, uuid2, sw2, fmt.Sprintf("[boot_check]\nevent_log = %q\n", log2))
		before := len(cp.log.String())
		r := run(t, "", m.env(), "bcd", "intake", "--config", m.cfg)
		if r.code != 1 || !strings.Contains(r.stderr, "Intake refused") {
			t.Fatalf("bcd intake of a boot without HookOS: %s", r)
		}
		logged := cp.log.String()[before:]
		if !strings.Contains(logged, "fails the install-environment boot policy at intake: intake_required_authorities") || !strings.Contains(logged, "reason_code=boot_policy") {
			t.Errorf("fleetd did not log the policy's rule:\n%s", tail(logged, 20))
		}
		if strings.Contains(logged, "allowed_authorities:") {
			t.Errorf("a rule other than intake_required_authorities failed:\n%s", tail(logged, 20))
		}
		if n := cp.verdictCount(t, "web-02"); n != 1 {
			t.Errorf("%d verdicts of web-02, want its refused intake's", n)
		}
		// Without an intake there is nothing to install with: no code, no marker.
		runDir := filepath.Join(t.TempDir(), "run")
		codeFile, marker := filepath.Join(runDir, "install-code"), filepath.Join(runDir, "boot-pass")
		r = runBCD(t, m, "install", "--config", m.cfg, "--lldp-file", lldpFile(t, "nt-swp1", time.Now()), "--code-file", codeFile, "--pass-marker", marker)
		if r.code == 0 || !strings.Contains(r.stderr, "run bcd intake first") {
			t.Errorf("bcd install after a refused intake: %s", r)
		}
		for _, f := range []string{codeFile, marker} {
			if _, err := os.Stat(f); !os.IsNotExist(err) {
				t.Errorf("%s after a refused intake: %v", f, err)
			}
		}
		// No provision was started: web-02 is only declared (planned), with
		// no node record.
		if r := cp.fleetd(t, "", "nodes", "show", "web-02"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
			t.Errorf("web-02 after a refused intake: %s", r)
		}
	})
	if v := cp.metric(t, `nodetrust_install_requests_total{outcome="issued"}`); v != 1 {
		t.Errorf("issued installs: %v, want web-01's alone", v)
	}
}

// runBCD runs bcd with args on m.
func runBCD(t *testing.T, m *machine, args ...string) result {
	t.Helper()
	return run(t, "", m.env(), "bcd", args...)
}

// Seed 003 section 8's "the inventory (NetBox) cannot answer" during
// installation, with the fake NetBox as the inventory source: web-2's
// install, after an intake that NetBox answered, is refused UNAVAILABLE
// with rule inventory-unavailable and no code; web-1, already active,
// keeps renewing its certificate while NetBox is down; and once NetBox
// answers again the same intake session goes on past the inventory rule
// (the refusal changed nothing).
func TestInstallRefusedWhileNetBoxCannotAnswer(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef01234567"
	nb := netboxfake.Start(token)
	t.Cleanup(nb.Close)
	tokenFile := filepath.Join(t.TempDir(), "netbox-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(t.TempDir(), "worker.tmpl")
	if err := os.WriteFile(tmpl, []byte(installTemplate), 0o600); err != nil {
		t.Fatal(err)
	}
	sw1, sw2 := tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t)
	cp := startControlPlane(t, "http_listen = \"127.0.0.1:0\"\nnode_cert_lifetime = \"4s\"\nrenewal_limit = 1000\n"+ekRootsConfig(t, sw1, sw2)+
		fmt.Sprintf("[inventory]\nauto_provision = true\nsource = \"netbox\"\n[inventory.netbox]\nurl = %q\ntoken_file = %q\ndeclarer_user = \"terraform\"\n", nb.URL, tokenFile)+
		fmt.Sprintf("[render.worker]\nkind = \"template\"\ntemplate = %q\n", tmpl))
	for _, d := range []struct{ name, uuid, pin string }{{"web-1", uuid1, ekPin(t, sw1)}, {"web-2", uuid2, ekPin(t, sw2)}} {
		nb.Put("terraform", netboxfake.Device{Name: d.name, Site: "rack1", Role: "worker", CustomFields: map[string]any{
			"product_uuid": d.uuid, "class": "worker", "install_disk": "/dev/sda", "ek_pins": d.pin, "ek_source": "receiving-scan",
			"expected_chassis": "sw-01", "expected_port": "nt-swp1"}})
	}

	m1 := tpmMachine(t, cp, uuid1, sw1, "")
	if node := joinedAs(t, tpmJoin(t, m1, "", false)); node != "web-1" {
		t.Fatalf("joined as %s", node)
	}
	a := startAgent(t, m1)
	a.waitFor(t, renewedRE, 60*time.Second)

	m2 := tpmMachine(t, cp, uuid2, sw2, "")
	if r := runBCD(t, m2, "intake", "--config", m2.cfg); r.code != 0 || !strings.Contains(r.stdout, "intake passed as web-2") {
		t.Fatalf("bcd intake: %s", r)
	}
	codeFile := filepath.Join(t.TempDir(), "run", "install-code")
	askInstall := func() result {
		return runBCD(t, m2, "install", "--config", m2.cfg, "--lldp-file", lldpFile(t, "nt-swp1", time.Now()), "--code-file", codeFile,
			"--pass-marker", filepath.Join(filepath.Dir(codeFile), "boot-pass"))
	}

	nb.SetDown(true)
	before := len(cp.log.String())
	r := askInstall()
	if r.code != 1 || !strings.Contains(r.stderr, "Install refused: the inventory cannot answer now; nothing was changed: try again later") {
		t.Fatalf("bcd install with NetBox down: %s", r)
	}
	if logged := cp.log.String()[before:]; !strings.Contains(logged, "rule=inventory-unavailable") {
		t.Errorf("fleetd did not log rule inventory-unavailable:\n%s", tail(logged, 20))
	}
	if _, err := os.Stat(codeFile); !os.IsNotExist(err) {
		t.Errorf("a code file with NetBox down: %v", err)
	}
	// Nothing already issued changes: web-1 renews (twice, so at least
	// once after NetBox went down) and stays active.
	a.waitFor(t, renewedRE, 60*time.Second)
	a.waitFor(t, renewedRE, 60*time.Second)
	if got := cp.nodeState(t, "web-1"); got != store.StateActive {
		t.Errorf("web-1 is %s with NetBox down, want active", got)
	}
	if v := cp.metric(t, `nodetrust_install_requests_total{outcome="issued"}`); v != 0 {
		t.Errorf("issued installs with NetBox down: %v", v)
	}

	// NetBox answers again: the same session is admitted, and the code
	// is issued.
	nb.SetDown(false)
	if r = askInstall(); r.code != 0 || !strings.Contains(r.stdout, "install admitted as web-2") {
		t.Errorf("bcd install with NetBox back: %s\nfleetd:\n%s", r, tail(cp.log.String(), 20))
	}
	if _, err := os.Stat(codeFile); err != nil {
		t.Errorf("no code file once NetBox answers: %v", err)
	}
}
