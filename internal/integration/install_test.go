package integration

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/install"
	// The store's package registers the SQLite driver the stale-session
	// case writes through.
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	_ "github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// installTemplate is the worker class's render: it names the node and
// carries its join credential, so the test can look for both in logs.
const installTemplate = "node={{.node.name}} disk={{.node.install_disk}}\njoin_token={{.join_credential}}\n"

// installDecl is web-01 declared complete: a worker bound to pin, cabled
// to port nt-swp1 of switch sw-01 (the lldpctl fixture's neighbour).
func installDecl(pin string) string {
	return "version: 1\nnodes:\n" + fmt.Sprintf("  - name: web-01\n    product_uuid: %s\n    class: worker\n    site: rack1\n", uuid1) +
		"    install_disk: /dev/sda\n    expected_port:\n      chassis: sw-01\n      port: nt-swp1\n" +
		fmt.Sprintf("    ek_binding:\n      pins: [%q]\n      source: receiving-scan\n", pin)
}

// lldpFile writes the lldpctl fixture with port id port, modified at mtime.
func lldpFile(t *testing.T, port string, mtime time.Time) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "bcd", "netreport", "testdata", "lldpctl-one.json"))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "lldp.json")
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), `"nt-swp1"`, fmt.Sprintf("%q", port), 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	return p
}

var sessionRE = regexp.MustCompile(`session ([0-9a-f]+) until`)

// Seed 003 section 8's acceptance exercise with the real binaries on
// swtpm: the rejections of a wrong EK, a stale session, a wrong port
// report and a report too old — each telling the machine what to do,
// with no code written — then a successful install (intake → install →
// the code unwrapped by the TPM → the config fetched once with it → the
// node active) and the spent code refused. Neither the code nor the
// config (its join credential) appears in any log.
func TestInstallAcceptance(t *testing.T) {
	sw, other := tpmtest.StartSwtpm(t), tpmtest.StartSwtpm(t)
	tmpl := filepath.Join(t.TempDir(), "worker.tmpl")
	if err := os.WriteFile(tmpl, []byte(installTemplate), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t, "http_listen = \"127.0.0.1:0\"\n"+ekRootsConfig(t, sw, other)+
		"[inventory]\nauto_provision = true\n"+
		fmt.Sprintf("[render.worker]\nkind = \"template\"\ntemplate = %q\n", tmpl)+
		"[install]\nreport_max_age = \"1m\"\n")
	declarer := cp.credential(t, "alice", "declarer")
	cp.apply(t, declarer, installDecl(ekPin(t, sw)))

	m := tpmMachine(t, cp, uuid1, sw, "")
	codeFile := filepath.Join(t.TempDir(), "run", "install-code")
	marker := filepath.Join(filepath.Dir(codeFile), "boot-pass")
	var nodeOut strings.Builder
	intake := func(t *testing.T, m *machine) string {
		t.Helper()
		r := run(t, "", m.env(), "bcd", "intake", "--config", m.cfg)
		nodeOut.WriteString(r.stdout + r.stderr)
		mm := sessionRE.FindStringSubmatch(r.stdout)
		if r.code != 0 || mm == nil {
			t.Fatalf("bcd intake: %s", r)
		}
		return mm[1]
	}
	installRun := func(t *testing.T, m *machine, lldp string) result {
		t.Helper()
		r := run(t, "", m.env(), "bcd", "install", "--config", m.cfg, "--lldp-file", lldp, "--code-file", codeFile, "--pass-marker", marker)
		nodeOut.WriteString(r.stdout + r.stderr)
		return r
	}
	refused := func(t *testing.T, r result, do, rule string, before int) {
		t.Helper()
		if r.code != 1 || !strings.Contains(r.stderr, "Install refused") || !strings.Contains(r.stderr, do) {
			t.Fatalf("bcd install: %s\nwant Install refused with %q", r, do)
		}
		if _, err := os.Stat(codeFile); !os.IsNotExist(err) {
			t.Fatalf("a refused install left a code file: %v", err)
		}
		if logged := cp.log.String()[before:]; !strings.Contains(logged, "rule="+rule) {
			t.Errorf("fleetd did not log rule %s:\n%s", rule, tail(logged, 20))
		}
	}
	session := intake(t, m)

	t.Run("a wrong port report is refused", func(t *testing.T) {
		before := len(cp.log.String())
		r := installRun(t, m, lldpFile(t, "nt-swp9", time.Now()))
		refused(t, r, "check its cable", "expected-port", before)
		if strings.Contains(r.stderr, "nt-swp1") {
			t.Errorf("the declared port reached the machine: %s", r.stderr)
		}
	})

	t.Run("a report too old is refused", func(t *testing.T) {
		before := len(cp.log.String())
		r := installRun(t, m, lldpFile(t, "nt-swp1", time.Now().Add(-5*time.Minute)))
		refused(t, r, "send a fresh one", "network-report-age", before)
	})

	t.Run("a wrong EK is refused", func(t *testing.T) {
		// Another (trusted) TPM claiming the declared device gets no
		// intake, so no session to install with.
		before := len(cp.log.String())
		wrong := tpmMachine(t, cp, uuid1, other, "")
		r := run(t, "", wrong.env(), "bcd", "intake", "--config", wrong.cfg)
		nodeOut.WriteString(r.stdout + r.stderr)
		if r.code != 1 || !strings.Contains(r.stderr, "Intake refused") || !strings.Contains(r.stderr, "bcd intake again") {
			t.Fatalf("bcd intake with another TPM: %s", r)
		}
		if logged := cp.log.String()[before:]; !strings.Contains(logged, "whose binding names other EKs") {
			t.Errorf("fleetd did not log why:\n%s", tail(logged, 20))
		}
		// Nor can it use the declared machine's intake: its TPM derives
		// another device key than the intake's record names.
		if err := os.CopyFS(filepath.Join(wrong.dataDir, "devid"), os.DirFS(filepath.Join(m.dataDir, "devid"))); err != nil {
			t.Fatal(err)
		}
		r = installRun(t, wrong, lldpFile(t, "nt-swp1", time.Now()))
		if r.code != 1 || !strings.Contains(r.stderr, "is this the TPM of the intake?") {
			t.Fatalf("bcd install with another TPM: %s", r)
		}
		if _, err := os.Stat(codeFile); !os.IsNotExist(err) {
			t.Fatalf("another TPM got a code file: %v", err)
		}
	})

	t.Run("a stale session is refused", func(t *testing.T) {
		// Time moves past the session's end: the store's row says it
		// ended a minute ago.
		db, err := sql.Open("sqlite", "file:"+filepath.Join(cp.dir, "data", "fleetd.db")+"?_pragma=busy_timeout(10000)")
		if err != nil {
			t.Fatal(err)
		}
		res, err := db.ExecContext(t.Context(), `UPDATE intake_sessions SET expires_at = ? WHERE id = ?`, time.Now().Add(-time.Minute).UnixNano(), session)
		if n, _ := res.RowsAffected(); err != nil || n != 1 {
			t.Fatalf("end the session: %d rows, %v", n, err)
		}
		db.Close()
		before := len(cp.log.String())
		r := installRun(t, m, lldpFile(t, "nt-swp1", time.Now()))
		refused(t, r, "stale session): run bcd intake again", "intake-session", before)
	})

	// The refusals issued nothing: no code, no provision.
	if v := cp.metric(t, `nodetrust_install_requests_total{outcome="issued"}`); v != 0 {
		t.Fatalf("issued installs after the refusals: %v, want 0", v)
	}

	client, base := cp.httpsClient(t)
	var code string
	fetch := func(t *testing.T) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+install.ConfigPath(uuid1), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+code)
		rsp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer rsp.Body.Close()
		b, err := io.ReadAll(rsp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return rsp.StatusCode, b
	}
	var config []byte

	t.Run("a fresh intake and a matching report install the machine", func(t *testing.T) {
		intake(t, m)
		r := installRun(t, m, lldpFile(t, "nt-swp1", time.Now()))
		if r.code != 0 || !strings.Contains(r.stdout, "install admitted as web-01") {
			t.Fatalf("bcd install: %s", r)
		}
		st, err := os.Stat(codeFile)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("code file: %v %v", st, err)
		}
		b, err := os.ReadFile(codeFile)
		if err != nil {
			t.Fatal(err)
		}
		code = strings.TrimSuffix(string(b), "\n")
		if _, err := install.ParseCode(code); err != nil {
			t.Fatalf("the code file holds no code: %v", err)
		}
		// Without [boot_policy] fleetd judged no boot: no pass marker.
		if _, err := os.Stat(marker); !os.IsNotExist(err) || !strings.Contains(r.stdout, "no boot pass marker") {
			t.Errorf("pass marker without a passed verdict: %v\n%s", err, r.stdout)
		}
		if got := cp.nodeState(t, "web-01"); got != store.StateProvisioning {
			t.Errorf("web-01 is %s after the install code, want provisioning", got)
		}
		var status int
		status, config = fetch(t)
		if status != http.StatusOK || !strings.Contains(string(config), "node=web-01 disk=/dev/sda\njoin_token=ntjt_") {
			t.Fatalf("fetch: %d %q", status, config)
		}
		cp.waitMetric(t, `nodetrust_config_activations_total{outcome="active"}`, 1)
		if got := cp.nodeState(t, "web-01"); got != store.StateActive {
			t.Fatalf("web-01 is %s after the release, want active", got)
		}
		if v := cp.metric(t, `nodetrust_install_requests_total{outcome="issued"}`); v != 1 {
			t.Errorf("issued installs: %v, want 1", v)
		}
	})
	if code == "" {
		t.FailNow()
	}

	t.Run("a spent code is refused", func(t *testing.T) {
		if status, b := fetch(t); status != http.StatusGone || !strings.Contains(string(b), "was spent") {
			t.Fatalf("second fetch: %d %q, want 410 Gone saying it is spent", status, b)
		}
	})

	t.Run("neither the code nor the config appears in any log", func(t *testing.T) {
		token := strings.TrimPrefix(regexp.MustCompile(`join_token=(\S+)`).FindString(string(config)), "join_token=")
		for what, s := range map[string]string{"fleetd's log": cp.log.String(), "bcd's output": nodeOut.String()} {
			if strings.Contains(s, code) {
				t.Errorf("%s holds the install code", what)
			}
			if token == "" || strings.Contains(s, token) {
				t.Errorf("%s holds the join credential (or the config has none)", what)
			}
		}
	})
}

// A worker whose class renders with Talos's machinery is installed the
// same way: the config fetched with the unwrapped code is the Talos
// machine config of web-01 (validated by fleetd in metal mode before any
// code was issued), carrying the join credential as a 0600 machine file.
func TestInstallReleasesATalosConfig(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	secrets := filepath.Join(t.TempDir(), "secrets.yaml")
	if r := run(t, "", nil, "fleetd", "render", "secrets", "--out", secrets); r.code != 0 {
		t.Fatalf("fleetd render secrets: %s", r)
	}
	cp := startControlPlane(t, "http_listen = \"127.0.0.1:0\"\n"+ekRootsConfig(t, sw)+
		"[inventory]\nauto_provision = true\n"+
		fmt.Sprintf("[render.worker]\nkind = \"talos\"\ncluster_name = \"lab\"\ncluster_endpoint = \"https://k8s.example.org:6443\"\nsecrets_file = %q\n", secrets))
	declarer := cp.credential(t, "alice", "declarer")
	cp.apply(t, declarer, installDecl(ekPin(t, sw)))
	m := tpmMachine(t, cp, uuid1, sw, "")
	if r := run(t, "", m.env(), "bcd", "intake", "--config", m.cfg); r.code != 0 {
		t.Fatalf("bcd intake: %s", r)
	}
	codeFile := filepath.Join(t.TempDir(), "install-code")
	r := run(t, "", m.env(), "bcd", "install", "--config", m.cfg, "--lldp-file", lldpFile(t, "nt-swp1", time.Now()), "--code-file", codeFile,
		"--pass-marker", filepath.Join(t.TempDir(), "boot-pass"))
	if r.code != 0 {
		t.Fatalf("bcd install: %s", r)
	}
	b, err := os.ReadFile(codeFile)
	if err != nil {
		t.Fatal(err)
	}
	code := strings.TrimSpace(string(b))
	client, base := cp.httpsClient(t)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+install.ConfigPath(uuid1), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+code)
	rsp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer rsp.Body.Close()
	config, err := io.ReadAll(rsp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if rsp.StatusCode != http.StatusOK || rsp.Header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("fetch: %d %s %q", rsp.StatusCode, rsp.Header.Get("Content-Type"), config)
	}
	for _, want := range []string{"type: worker", "hostname: web-01", "disk: /dev/sda", "/var/etc/bcd/join-token", "ntjt_"} {
		if !strings.Contains(string(config), want) {
			t.Errorf("the Talos config lacks %q", want)
		}
	}
	token := regexp.MustCompile(`ntjt_[A-Za-z0-9_-]+`).FindString(string(config))
	if log := cp.log.String(); strings.Contains(log, code) || token == "" || strings.Contains(log, token) {
		t.Errorf("fleetd's log holds the code or the join credential")
	}
}
