package bootpolicy_test

import (
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/pki/pkitest"
)

func TestLoad(t *testing.T) {
	f := newFixture(t)
	if got := strings.Join(f.policies.Classes(), ","); got != "control-plane,install,lab,worker" {
		t.Fatalf("classes %s", got)
	}
	w, err := f.policies.Policy("worker")
	if err != nil {
		t.Fatal(err)
	}
	if !w.SecureBoot || len(w.Allowed) != 2 || w.Allowed[0].Subject != "CN=Talos Secure Boot Signing" || w.Allowed[1].Subject != "" ||
		len(w.BootApplications) != 2 || strings.Join(w.IntakeRequired, ",") != "HookOS" || strings.Join(w.RenewRequired, ",") != "Talos" {
		t.Fatalf("worker policy %+v", w)
	}
	if w.Allowed[0].SHA256 != sha256Sum(f.talos.Cert.Raw) {
		t.Error("the Talos authority's digest is not its certificate's")
	}
	cp, _ := f.policies.Policy("control-plane")
	if cp.SHA256 == w.SHA256 || !strings.HasPrefix(cp.SHA256, "sha256:") {
		t.Errorf("policy digests %s and %s", cp.SHA256, w.SHA256)
	}

	t.Run("a policy's digest follows its certificate file", func(t *testing.T) {
		other := pkitest.NewCA(t, "Talos Secure Boot Signing")
		writeFile(t, filepath.Join(f.dir, "certs", "talos.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: other.Cert.Raw}))
		ps, err := bootpolicy.Load(bootpolicy.Config{Dir: f.dir})
		if err != nil {
			t.Fatal(err)
		}
		w2, _ := ps.Policy("worker")
		if w2.SHA256 == w.SHA256 || w2.Allowed[0].SHA256 != sha256Sum(other.Cert.Raw) {
			t.Fatal("another certificate in the same file left the policy's digest unchanged")
		}
	})
}

// TestLoadRefuses checks that every mistake in a policy directory stops
// the load, naming the file and the setting: nothing runs on a policy
// fleetd could not read.
func TestLoadRefuses(t *testing.T) {
	const ok = `class = "worker"
secure_boot = false
`
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"an empty directory", nil, []string{"no policy file"}},
		{"TOML that does not parse", map[string]string{"w.toml": "class = \n"}, []string{"w.toml"}},
		{"an unknown setting", map[string]string{"w.toml": ok + "secureboot = true\n"}, []string{"w.toml", "unknown setting secureboot"}},
		{"secure_boot left out", map[string]string{"w.toml": `class = "worker"` + "\n"}, []string{"secure_boot: must be set"}},
		{"no class", map[string]string{"w.toml": "secure_boot = false\n"}, []string{"class: \"\" is not a class name"}},
		{"a class name with a space", map[string]string{"w.toml": `class = "gpu worker"` + "\nsecure_boot = false\n"}, []string{"is not a class name"}},
		{"two files for one class", map[string]string{"a.toml": ok, "b.toml": ok}, []string{"b.toml", `class "worker" is already the class of`}},
		{"Secure Boot required with no authority allowed", map[string]string{"w.toml": `class = "worker"` + "\nsecure_boot = true\n"}, []string{"at least one authority must be allowed"}},
		{"an authority with neither file nor digest", map[string]string{"w.toml": ok + "[[allowed_authorities]]\nname = \"x\"\n"}, []string{"allowed_authorities[0] (x): give exactly one of file"}},
		{"an authority with both", map[string]string{"w.toml": ok + "[[allowed_authorities]]\nname = \"x\"\nfile = \"x.pem\"\nsha256 = \"00\"\n"}, []string{"exactly one of file"}},
		{"a digest that is not one", map[string]string{"w.toml": ok + "[[allowed_authorities]]\nname = \"x\"\nsha256 = \"abcd\"\n"}, []string{"sha256: \"abcd\" is not 64 hex digits"}},
		{"a missing certificate file", map[string]string{"w.toml": ok + "[[allowed_authorities]]\nname = \"x\"\nfile = \"missing.pem\"\n"}, []string{"missing.pem"}},
		{"a certificate file without a certificate", map[string]string{"w.toml": ok + "[[allowed_authorities]]\nname = \"x\"\nfile = \"x.pem\"\n", "x.pem": "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"}, []string{"no PEM CERTIFICATE block"}},
		{"a required authority that is not allowed", map[string]string{"w.toml": ok + "renew_required_authorities = [\"Talos\"]\n"}, []string{`renew_required_authorities: "Talos" is not the name`}},
		{"a pin without a digest", map[string]string{"w.toml": ok + "[[boot_applications]]\nname = \"shim\"\n"}, []string{"boot_applications[0] (shim): sha256"}},
		{"the same pin twice", map[string]string{"w.toml": ok + "[[boot_applications]]\nname = \"a\"\nsha256 = \"" + strings.Repeat("ab", 32) + "\"\n[[boot_applications]]\nname = \"b\"\nsha256 = \"" + strings.Repeat("AB", 32) + "\"\n"}, []string{"boot_applications[1] (b): the same digest as a"}},
		{"a mode that is not one", map[string]string{"w.toml": ok + "mode = \"warn\"\n"}, []string{`mode: "warn" is neither "enforce" nor "audit"`}},
		{"quarantine_after zero", map[string]string{"w.toml": ok + "[response]\nquarantine_after = 0\n"}, []string{"response.quarantine_after: 0 is not between 1 and 20"}},
		{"a critical rule that is not a rule", map[string]string{"w.toml": ok + "[response]\ncritical = [\"secureboot\"]\n"}, []string{`response.critical: "secureboot" is not a rule`}},
		{"an unknown response setting", map[string]string{"w.toml": ok + "[response]\nquarantine_afer = 2\n"}, []string{"unknown setting response.quarantine_afer"}},
		{"a mode in next", map[string]string{"w.toml": ok + "[next]\nnot_before = 2026-01-01T00:00:00Z\nnot_after = 2026-02-01T00:00:00Z\nsecure_boot = true\nmode = \"audit\"\n"}, []string{"unknown setting next.mode"}},
		{"every mistake of a file at once", map[string]string{"w.toml": "class = \"Worker\"\nintake_required_authorities = [\"HookOS\"]\n"}, []string{"is not a class name", "secure_boot: must be set", `"HookOS" is not the name`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tc.files {
				writeFile(t, filepath.Join(dir, name), []byte(body))
			}
			ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
			if ps != nil || !errors.Is(err, bootpolicy.ErrPolicy) {
				t.Fatalf("policies %v, error %v; want ErrPolicy", ps, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	t.Run("a directory that does not exist", func(t *testing.T) {
		_, err := bootpolicy.Load(bootpolicy.Config{Dir: filepath.Join(t.TempDir(), "nope")})
		if !errors.Is(err, bootpolicy.ErrPolicy) || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("no directory", func(t *testing.T) {
		if _, err := bootpolicy.Load(bootpolicy.Config{}); !errors.Is(err, bootpolicy.ErrPolicy) {
			t.Fatalf("error %v", err)
		}
	})
}

func TestLoadModeAndResponse(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "w.toml"), []byte("class = \"worker\"\nsecure_boot = false\n"))
	writeFile(t, filepath.Join(dir, "a.toml"), []byte(`class = "lab"
mode = "audit"
secure_boot = false

[response]
quarantine_after = 3
critical = ["secure_boot", "allowed_authorities"]

[next]
not_before = 2026-01-01T00:00:00Z
not_after = 2026-02-01T00:00:00Z
secure_boot = true

[[next.allowed_authorities]]
name = "x"
sha256 = "`+strings.Repeat("ab", 32)+`"
`))
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	w, _ := ps.Policy("worker")
	if w.Mode != bootpolicy.ModeEnforce || !w.Enforced() || w.QuarantineAfter != 1 || len(w.Critical) != 0 {
		t.Errorf("defaults: mode %s, quarantine_after %d, critical %v; want enforce, 1, none", w.Mode, w.QuarantineAfter, w.Critical)
	}
	a, _ := ps.Policy("lab")
	if a.Mode != bootpolicy.ModeAudit || a.Enforced() || a.QuarantineAfter != 3 || !a.IsCritical("secure_boot") || !a.IsCritical("allowed_authorities") || a.IsCritical("event_log") {
		t.Errorf("lab: mode %s, quarantine_after %d, critical %v", a.Mode, a.QuarantineAfter, a.Critical)
	}
	if a.Next == nil || a.Next.Mode != bootpolicy.ModeAudit || a.Next.QuarantineAfter != 3 {
		t.Errorf("the next state does not share the mode and response: %+v", a.Next)
	}
	t.Run("promote keeps mode and response", func(t *testing.T) {
		if _, err := bootpolicy.Promote(filepath.Join(dir, "a.toml"), time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC)); err != nil {
			t.Fatal(err)
		}
		ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		a, _ := ps.Policy("lab")
		if a.Mode != bootpolicy.ModeAudit || a.QuarantineAfter != 3 || strings.Join(a.Critical, ",") != "secure_boot,allowed_authorities" || !a.SecureBoot || a.Next != nil {
			t.Errorf("promoted: %+v", a)
		}
	})
}
