package fleetd

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
)

// policyDir writes a permissive policy for each class.
func policyDir(t *testing.T, classes ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, c := range classes {
		if err := os.WriteFile(filepath.Join(dir, c+".toml"), []byte("class = \""+c+"\"\nsecure_boot = false\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func bootConfig(dir string, classes ...string) *config.Fleetd {
	c := &config.Fleetd{}
	c.BootPolicy = config.BootPolicy{Dir: dir, VerdictLogMaxBytes: bootpolicy.DefaultVerdictLogMaxBytes, VerdictLogKeep: 2, ControlPlaneClasses: []string{"control-plane"}}
	c.Inventory.Classes = classes
	return c
}

func TestBootPolicyLoadsFailingClosed(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	t.Run("a policy for every class loads, with the verdict log", func(t *testing.T) {
		data := t.TempDir()
		w, err := openBootPolicy(bootConfig(policyDir(t, "worker", "control-plane", "install-environment")), data, log)
		if err != nil || w.policies == nil || w.log == nil {
			t.Fatalf("openBootPolicy = %+v, %v", w, err)
		}
		defer w.log.Close()
		if w.log.Path() != filepath.Join(data, bootpolicy.VerdictLogName) {
			t.Errorf("verdict log at %s", w.log.Path())
		}
	})
	t.Run("without a directory there is no boot policy", func(t *testing.T) {
		w, err := openBootPolicy(bootConfig(""), t.TempDir(), log)
		if err != nil || w.policies != nil || w.log != nil {
			t.Fatalf("openBootPolicy = %+v, %v; want nothing", w, err)
		}
	})
	for _, c := range []struct {
		name    string
		cfg     *config.Fleetd
		wantErr []string
	}{
		{"a class a declaration may name without a policy", bootConfig(policyDir(t, "worker", "control-plane")), []string{"no policy for class install-environment"}},
		{"a policy for a mistyped class", bootConfig(policyDir(t, "worker", "control-plane", "install-environment", "wroker")), []string{"class wroker", "mistyped"}},
		{"a configured class without a policy", bootConfig(policyDir(t, "worker", "control-plane"), "worker", "gpu"), []string{"no policy for class gpu"}},
		{"a directory that does not exist", bootConfig(filepath.Join(t.TempDir(), "nope")), []string{"boot_policy.dir", "nope"}},
	} {
		t.Run(c.name+" stops the start", func(t *testing.T) {
			_, err := openBootPolicy(c.cfg, t.TempDir(), log)
			if err == nil {
				t.Fatal("openBootPolicy succeeded")
			}
			for _, want := range c.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	t.Run("a bad webhook URL stops the start", func(t *testing.T) {
		cfg := bootConfig("")
		cfg.Actuator.WebhookURL = "ftp://example.org"
		if _, err := openBootPolicy(cfg, t.TempDir(), log); err == nil || !strings.Contains(err.Error(), "actuator.webhook_url") {
			t.Errorf("openBootPolicy = %v", err)
		}
	})
}
