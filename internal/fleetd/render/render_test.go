package render_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/render"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
)

// secret is the join credential of the tests: it must appear in a render
// and in no error.
const secret = "nt1.SECRET-join-credential-0123456789"

func input() render.Input {
	return render.Input{
		Node: render.FromDeclaration(store.Declaration{
			Name: "web-01", Serial: "SN-1", ProductUUID: "6a1f5c1e-0000-4000-8000-000000000001",
			MACs: []string{"02:00:00:00:00:0a"}, Class: "gpu", Site: "rack1",
			InstallDisk: "/dev/disk/by-id/nvme-eui.0001", SwitchChassis: "sw-01", SwitchPort: "ge-0/0/1",
		}),
		Credential:        secret,
		CredentialExpires: time.Date(2026, 12, 2, 18, 0, 0, 0, time.UTC),
		Fleetd: render.Fleetd{Server: "fleetd.example.org:8443", ServingCASPKIPin: "sha256:aa",
			JoinSigningKeyPin: "sha256:bb", JoinEncryptionKeyPin: "sha256:cc"},
	}
}

func checkNoSecret(t *testing.T, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), secret) {
		t.Fatalf("the error carries the join credential: %v", err)
	}
}

func TestTemplateFillsFacts(t *testing.T) {
	tmpl, err := render.NewTemplate("gpu", `hostname: {{.node.name}}
role: {{.node.role}}
disk: {{json .node.install_disk}}
port: {{.node.expected_port.chassis}} {{.node.expected_port.port}}
macs: {{json .node.macs}}
server: {{.fleetd.server}}
pin: {{.fleetd.serving_ca_spki_pin}}
credential: {{.join_credential}}
expires: {{.join_credential_expires}}
owner: {{optional .node "owner"}} {{optional .node "site"}}
`, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := tmpl.Render(input())
	if err != nil {
		t.Fatal(err)
	}
	want := `hostname: web-01
role: gpu
disk: "/dev/disk/by-id/nvme-eui.0001"
port: sw-01 ge-0/0/1
macs: ["02:00:00:00:00:0a"]
server: fleetd.example.org:8443
pin: sha256:aa
credential: ` + secret + `
expires: 2026-12-02T18:00:00Z
owner:  rack1
`
	if string(cfg.Data) != want {
		t.Errorf("render:\n%s\nwant:\n%s", cfg.Data, want)
	}
	if cfg.ContentType != render.DefaultTemplateContentType || !cfg.CredentialExpires.Equal(input().CredentialExpires) {
		t.Errorf("content type %q, expiry %v", cfg.ContentType, cfg.CredentialExpires)
	}
}

func TestTemplateRefusesMissingKey(t *testing.T) {
	tmpl, err := render.NewTemplate("gpu", "site: {{.node.site}}\ncredential: {{.join_credential}}\n", "application/yaml")
	if err != nil {
		t.Fatal(err)
	}
	in := input()
	in.Node.Site = ""
	_, err = tmpl.Render(in)
	var fe *render.FieldError
	if !errors.As(err, &fe) || fe.Field != "site" || fe.Node != "web-01" {
		t.Fatalf("render without a site: %v, want a FieldError naming site", err)
	}
	checkNoSecret(t, err)

	// A fleetd fact the caller did not give is named too.
	tmpl, err = render.NewTemplate("gpu", "name: {{.fleetd.server_name}}\n", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err = tmpl.Render(input()); !errors.As(err, &fe) || fe.Field != "fleetd.server_name" {
		t.Fatalf("render without server_name: %v", err)
	}
}

func TestTemplateErrorHidesCredential(t *testing.T) {
	// A template that fails on the credential's value itself.
	tmpl, err := render.NewTemplate("gpu", `{{slice .join_credential 5 2}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render(input())
	if err == nil {
		t.Fatal("a failing template rendered")
	}
	checkNoSecret(t, err)
}

func TestCheckRefusesIncompleteInput(t *testing.T) {
	tmpl, err := render.NewTemplate("gpu", "{{.node.name}}", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*render.Input)
		field string
	}{
		{"no install disk", func(in *render.Input) { in.Node.InstallDisk = "" }, "install_disk"},
		{"relative disk", func(in *render.Input) { in.Node.InstallDisk = "sda" }, "install_disk"},
		{"disk with ..", func(in *render.Input) { in.Node.InstallDisk = "/dev/../etc/passwd" }, "install_disk"},
		{"disk with space", func(in *render.Input) { in.Node.InstallDisk = "/dev/sd a" }, "install_disk"},
		{"no name", func(in *render.Input) { in.Node.Name = "" }, "name"},
		{"no class", func(in *render.Input) { in.Node.Class = "" }, "class"},
		{"no credential", func(in *render.Input) { in.Credential = "" }, "join credential"},
		{"no expiry", func(in *render.Input) { in.CredentialExpires = time.Time{} }, "join credential"},
		{"no server", func(in *render.Input) { in.Fleetd.Server = "" }, "fleetd server address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := input()
			tc.edit(&in)
			_, err := tmpl.Render(in)
			var fe *render.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("got %v, want a FieldError naming %s", err, tc.field)
			}
			checkNoSecret(t, err)
		})
	}
}

func TestLoadTemplate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tmpl")
	if err := os.WriteFile(good, []byte("disk={{.node.install_disk}}"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl, err := render.LoadTemplate(good, "text/x-shellscript")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := tmpl.Render(input())
	if err != nil || string(cfg.Data) != "disk=/dev/disk/by-id/nvme-eui.0001" || cfg.ContentType != "text/x-shellscript" {
		t.Fatalf("render %q %q: %v", cfg.Data, cfg.ContentType, err)
	}
	bad := filepath.Join(dir, "bad.tmpl")
	if err := os.WriteFile(bad, []byte("{{.node.name"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := render.LoadTemplate(bad, ""); err == nil || !strings.Contains(err.Error(), "bad.tmpl") {
		t.Fatalf("a broken template loaded: %v", err)
	}
	if _, err := render.LoadTemplate(filepath.Join(dir, "none"), ""); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing template: %v", err)
	}
}

func TestRegistry(t *testing.T) {
	tmpl, err := render.NewTemplate("gpu", "{{.node.name}}", "")
	if err != nil {
		t.Fatal(err)
	}
	reg := render.NewRegistry(map[string]render.Renderer{"gpu": tmpl})
	if got := reg.Classes(); len(got) != 1 || got[0] != "gpu" {
		t.Errorf("classes %v", got)
	}
	cfg, err := reg.Render(input())
	if err != nil || string(cfg.Data) != "web-01" {
		t.Fatalf("render %q: %v", cfg.Data, err)
	}
	in := input()
	in.Node.Class = "storage"
	if _, err := reg.Render(in); !errors.Is(err, render.ErrNoRenderer) || !strings.Contains(err.Error(), "[render.storage]") {
		t.Fatalf("render of a class without renderer: %v", err)
	}
}

func TestFromDeclarationDefaultsRole(t *testing.T) {
	if n := render.FromDeclaration(store.Declaration{Name: "a", Class: "control-plane"}); n.Role != "control-plane" {
		t.Errorf("role %q, want the class", n.Role)
	}
	if n := render.FromDeclaration(store.Declaration{Name: "a", Class: "worker", Role: "web"}); n.Role != "web" {
		t.Errorf("role %q, want the declared one", n.Role)
	}
}

func TestFleetdFromPKI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	b, err := pki.Init(dir, pki.InitOptions{TrustDomain: "lab.nodetrust.test", ServerName: "fleetd.lab"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := render.FleetdFromPKI(dir, "fleetd.lab:8443")
	if err != nil {
		t.Fatal(err)
	}
	if f.Server != "fleetd.lab:8443" || f.ServerName != "fleetd.lab" || f.ServingCASPKIPin != b.ServingCASPKIPin.String() ||
		f.JoinSigningKeyPin != b.JoinSigningKeyPin.String() || f.JoinEncryptionKeyPin != b.JoinEncryptionKeyPin.String() {
		t.Errorf("fleetd %+v, bundle %+v", f, b)
	}
	if !strings.Contains(f.JoinEncryptionJWK, `"kty"`) {
		t.Errorf("JWK %q", f.JoinEncryptionJWK)
	}
	if _, err := render.FleetdFromPKI(dir, "fleetd.lab"); err == nil {
		t.Error("an address without a port was taken")
	}
	if _, err := render.FleetdFromPKI(t.TempDir(), "fleetd.lab:8443"); err == nil {
		t.Error("a folder without a bundle was taken")
	}
}

// TestTemplateBootstrapToken: a template reads the worker's own bootstrap
// token when the render has one, fails naming it when not, and an error
// never carries it.
func TestTemplateBootstrapToken(t *testing.T) {
	const token = "abcdef.0123456789abcdef"
	tmpl, err := render.NewTemplate("gpu", "token: {{.kube_bootstrap_token}}\n", "")
	if err != nil {
		t.Fatal(err)
	}
	in := input()
	in.KubeBootstrapToken = token
	cfg, err := tmpl.Render(in)
	if err != nil || string(cfg.Data) != "token: "+token+"\n" {
		t.Fatalf("render %q, %v", cfg.Data, err)
	}
	if _, err := tmpl.Render(input()); err == nil || !strings.Contains(err.Error(), "kube_bootstrap_token") {
		t.Fatalf("a render without a token: %v, want a refusal naming kube_bootstrap_token", err)
	}
	bad, err := render.NewTemplate("gpu", `{{slice .kube_bootstrap_token 5 2}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Render(in); err == nil || strings.Contains(err.Error(), token) {
		t.Fatalf("a failing template: %v, want an error without the token", err)
	}
}
