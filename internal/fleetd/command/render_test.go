package command

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/render/renderers"
)

// TestRenderSecrets makes a bundle with the command, loads it as a
// class's secrets_file, and checks the command never replaces it.
func TestRenderSecrets(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "secrets.yaml")
	stdout, stderr, code := run(t, "render", "secrets", "--out", out)
	if code != 0 || !strings.Contains(stdout, "wrote the Talos secrets bundle") {
		t.Fatalf("render secrets: exit %d, %s%s", code, stdout, stderr)
	}
	fi, err := os.Stat(out)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("bundle %v: %v", fi, err)
	}
	before, _ := os.ReadFile(out)

	configPath := filepath.Join(dir, "fleetd.toml")
	write(t, configPath, "pki_dir = \"pki\"\ndata_dir = \"data\"\n[render.worker]\nkind = \"talos\"\ncluster_name = \"lab\"\n"+
		"cluster_endpoint = \"https://k8s.example.org:6443\"\nsecrets_file = \"secrets.yaml\"\n")
	cfg, err := config.LoadFleetd(configPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := renderers.Load(cfg); err != nil {
		t.Fatalf("the bundle does not load as secrets_file: %v", err)
	}

	_, stderr, code = run(t, "render", "secrets", "--out", out)
	if code == 0 || !strings.Contains(stderr, "exists") {
		t.Fatalf("a second bundle over the first: exit %d, %s", code, stderr)
	}
	if after, _ := os.ReadFile(out); string(after) != string(before) {
		t.Fatal("the bundle was replaced")
	}
	if _, stderr, code = run(t, "render", "secrets"); code != 2 || !strings.Contains(stderr, "--out") {
		t.Fatalf("without --out: exit %d, %s", code, stderr)
	}
}
