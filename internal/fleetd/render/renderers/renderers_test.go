package renderers_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/render"
	"github.com/nodetrust/nodetrust/internal/fleetd/render/renderers"
	"github.com/nodetrust/nodetrust/internal/fleetd/render/talos"
)

const fleetdTOML = `pki_dir = "pki"
data_dir = "data"

[render.worker]
kind = "talos"
cluster_name = "lab"
cluster_endpoint = "https://k8s.example.org:6443"
secrets_file = "secrets.yaml"

[render.install-environment]
kind = "template"
template = "hook.tmpl"
content_type = "text/x-shellscript"
`

func setup(t *testing.T, toml string) string {
	t.Helper()
	dir := t.TempDir()
	if err := talos.GenerateSecrets(filepath.Join(dir, "secrets.yaml"), ""); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hook.tmpl"), []byte("disk={{.node.install_disk}} token={{.join_credential}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "fleetd.toml")
	if err := os.WriteFile(p, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func input(name, class string) render.Input {
	return render.Input{
		Node:       render.Node{Name: name, Class: class, Role: class, InstallDisk: "/dev/sda"},
		Credential: "nt1.secret", CredentialExpires: time.Now().Add(time.Hour),
		Fleetd: render.Fleetd{Server: "fleetd.example.org:8443"},
	}
}

func TestLoadBuildsEachClass(t *testing.T) {
	cfg, err := config.LoadFleetd(setup(t, fleetdTOML))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := renderers.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(reg.Classes(), ","); got != "install-environment,worker" {
		t.Errorf("classes %s", got)
	}
	c, err := reg.Render(input("w-1", "worker"))
	if err != nil || c.ContentType != talos.ContentType || !strings.Contains(string(c.Data), "hostname: w-1") {
		t.Fatalf("worker render %q: %v", c.ContentType, err)
	}
	c, err = reg.Render(input("hook-1", "install-environment"))
	if err != nil || string(c.Data) != "disk=/dev/sda token=nt1.secret\n" || c.ContentType != "text/x-shellscript" {
		t.Fatalf("template render %q %q: %v", c.Data, c.ContentType, err)
	}
	if _, err := reg.Render(input("cp-1", "control-plane")); err == nil || !strings.Contains(err.Error(), "[render.control-plane]") {
		t.Fatalf("a class without renderer: %v", err)
	}
}

func TestLoadNamesTheSetting(t *testing.T) {
	p := setup(t, fleetdTOML)
	dir := filepath.Dir(p)
	cfg, err := config.LoadFleetd(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "secrets.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := renderers.Load(cfg); err == nil || !strings.Contains(err.Error(), "render.worker.secrets_file") {
		t.Fatalf("a readable secrets file: %v", err)
	}
	if err := os.Chmod(filepath.Join(dir, "secrets.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hook.tmpl"), []byte("{{.node.name"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := renderers.Load(cfg); err == nil || !strings.Contains(err.Error(), "render.install-environment.template") {
		t.Fatalf("a broken template: %v", err)
	}
}
