package talos_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"

	"github.com/nodetrust/nodetrust/internal/fleetd/render"
	"github.com/nodetrust/nodetrust/internal/fleetd/render/talos"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const secret = "nt1.SECRET-join-credential-0123456789"

// secretsFile is one secrets bundle for the package's tests (generating
// one makes several CAs).
var secretsFile string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "talos-secrets")
	if err != nil {
		panic(err)
	}
	secretsFile = filepath.Join(dir, "secrets.yaml")
	if err := talos.GenerateSecrets(secretsFile, ""); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func settings() talos.Settings {
	return talos.Settings{ClusterName: "lab", ClusterEndpoint: "https://k8s.example.org:6443", SecretsFile: secretsFile}
}

func input(name, class, disk string) render.Input {
	return render.Input{
		Node:              render.FromDeclaration(store.Declaration{Name: name, Serial: "SN-" + name, Class: class, InstallDisk: disk}),
		Credential:        secret,
		CredentialExpires: time.Now().Add(4 * time.Hour),
		Fleetd: render.Fleetd{Server: "fleetd.example.org:8443", ServingCASPKIPin: "sha256:aa", JoinSigningKeyPin: "sha256:bb",
			JoinEncryptionKeyPin: "sha256:cc", JoinEncryptionJWK: `{"kty":"EC"}`},
	}
}

func TestRenderParsesBackAndValidates(t *testing.T) {
	r, err := talos.New(settings())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, class string
		want        machine.Type
	}{
		{"worker-01", "worker", machine.TypeWorker},
		{"cp-01", "control-plane", machine.TypeControlPlane},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := r.Render(input(tc.name, tc.class, "/dev/nvme0n1"))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ContentType != talos.ContentType || cfg.CredentialExpires.IsZero() {
				t.Errorf("content type %q, expiry %v", cfg.ContentType, cfg.CredentialExpires)
			}
			parsed, err := configloader.NewFromBytes(cfg.Data)
			if err != nil {
				t.Fatalf("machinery cannot read the render: %v", err)
			}
			if _, err := parsed.Validate(talos.MetalMode); err != nil {
				t.Fatalf("the render does not validate: %v", err)
			}
			m := parsed.Machine()
			if m.Type() != tc.want {
				t.Errorf("machine type %s, want %s", m.Type(), tc.want)
			}
			if got := m.Network().Hostname(); got != tc.name {
				t.Errorf("hostname %q", got)
			}
			if got := m.Install().Disk(); got != "/dev/nvme0n1" {
				t.Errorf("install disk %q", got)
			}
			if got := parsed.Cluster().Name(); got != "lab" {
				t.Errorf("cluster %q", got)
			}
			if got := parsed.Cluster().Endpoint().String(); got != "https://k8s.example.org:6443" {
				t.Errorf("endpoint %q", got)
			}
			files, err := m.Files()
			if err != nil {
				t.Fatal(err)
			}
			byPath := map[string]string{}
			for _, f := range files {
				byPath[f.Path()] = f.Content()
				if f.Path() == "/var/etc/bcd/join-token" && f.Permissions() != 0o600 {
					t.Errorf("join token mode %04o", f.Permissions())
				}
				if f.Op() != "create" {
					t.Errorf("%s: op %q", f.Path(), f.Op())
				}
			}
			if byPath["/var/etc/bcd/join-token"] != secret {
				t.Errorf("the join credential is not in /var/etc/bcd/join-token: %v", byPath)
			}
			conf := byPath["/var/etc/bcd/config.toml"]
			for _, want := range []string{`server = "fleetd.example.org:8443"`, `serving_ca_spki_pin = "sha256:aa"`, `role = "` + tc.class + `"`, `data_dir = "/var/lib/bcd"`} {
				if !strings.Contains(conf, want) {
					t.Errorf("config.toml lacks %s:\n%s", want, conf)
				}
			}
			if byPath["/var/etc/bcd/join-encryption.jwk"] != `{"kty":"EC"}` {
				t.Errorf("JWK file: %q", byPath["/var/etc/bcd/join-encryption.jwk"])
			}
		})
	}
}

func TestRenderRefusesWithoutInstallDisk(t *testing.T) {
	r, err := talos.New(settings())
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Render(input("worker-01", "worker", ""))
	var fe *render.FieldError
	if !errors.As(err, &fe) || fe.Field != "install_disk" {
		t.Fatalf("render without install disk: %v", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("the error carries the credential: %v", err)
	}
}

func TestRenderRefusesBadHostname(t *testing.T) {
	r, err := talos.New(settings())
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Render(input("web_01", "worker", "/dev/sda"))
	var fe *render.FieldError
	if !errors.As(err, &fe) || fe.Field != "name" || strings.Contains(err.Error(), secret) {
		t.Fatalf("render of web_01: %v", err)
	}
}

func TestRenderRoleMapping(t *testing.T) {
	s := settings()
	s.ControlPlaneRoles = []string{"apiserver"}
	r, err := talos.New(s)
	if err != nil {
		t.Fatal(err)
	}
	in := input("api-01", "control-plane", "/dev/sda")
	in.Node.Role = "apiserver"
	cfg, err := r.Render(in)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := configloader.NewFromBytes(cfg.Data)
	if err != nil {
		t.Fatal(err)
	}
	if parsed.Machine().Type() != machine.TypeControlPlane {
		t.Errorf("role apiserver rendered as %s", parsed.Machine().Type())
	}
	// The class's name alone does not make a control plane.
	cfg, err = r.Render(input("cp-02", "control-plane", "/dev/sda"))
	if err != nil {
		t.Fatal(err)
	}
	if parsed, err = configloader.NewFromBytes(cfg.Data); err != nil || parsed.Machine().Type() != machine.TypeWorker {
		t.Errorf("role control-plane with control_plane_roles [apiserver]: %v", err)
	}
}

func TestNewRefusesBadSettings(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open.yaml")
	data, err := os.ReadFile(secretsFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(open, data, 0o644); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk.yaml")
	if err := os.WriteFile(junk, []byte("cluster: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*talos.Settings)
		key  string
	}{
		{"no cluster name", func(s *talos.Settings) { s.ClusterName = "" }, "cluster_name"},
		{"http endpoint", func(s *talos.Settings) { s.ClusterEndpoint = "http://k8s:6443" }, "cluster_endpoint"},
		{"no secrets", func(s *talos.Settings) { s.SecretsFile = "" }, "secrets_file"},
		{"missing secrets", func(s *talos.Settings) { s.SecretsFile = filepath.Join(dir, "none") }, "secrets_file"},
		{"readable secrets", func(s *talos.Settings) { s.SecretsFile = open }, "chmod 600"},
		{"incomplete secrets", func(s *talos.Settings) { s.SecretsFile = junk }, "secrets_file"},
		{"bad version", func(s *talos.Settings) { s.TalosVersion = "banana" }, "talos_version"},
		{"bcd dir outside /var", func(s *talos.Settings) { s.BCDDir = "/etc/bcd" }, "bcd_dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := settings()
			tc.edit(&s)
			if _, err := talos.New(s); err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("got %v, want an error naming %s", err, tc.key)
			}
		})
	}
}

func TestGenerateSecretsNeverReplaces(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(p, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := talos.GenerateSecrets(p, ""); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("generate over a file: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "keep" {
		t.Fatalf("the file was replaced: %q", b)
	}
	fi, err := os.Stat(secretsFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secrets file mode %v: %v", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
}

func TestGenerateSecretsForVersion(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.yaml")
	if err := talos.GenerateSecrets(p, "v1.10"); err != nil {
		t.Fatal(err)
	}
	s := settings()
	s.SecretsFile, s.TalosVersion = p, "v1.10"
	r, err := talos.New(s)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := r.Render(input("w-1", "worker", "/dev/sda"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := configloader.NewFromBytes(cfg.Data); err != nil {
		t.Fatal(err)
	}
}

// TestRenderConcurrently renders from several goroutines with one
// Renderer, as concurrent admissions do; run with -race.
func TestRenderConcurrently(t *testing.T) {
	r, err := talos.New(settings())
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		go func() {
			name := "w-" + string(rune('a'+i))
			cfg, err := r.Render(input(name, "worker", "/dev/sda"))
			if err == nil {
				parsed, perr := configloader.NewFromBytes(cfg.Data)
				switch {
				case perr != nil:
					err = perr
				case parsed.Machine().Network().Hostname() != name:
					err = errors.New("render of " + name + " has hostname " + parsed.Machine().Network().Hostname())
				}
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestRenderCarriesTheWorkersOwnToken: a worker's render carries its own
// bootstrap token in cluster.token, which its kubelet joins with; a
// control plane keeps the cluster's.
func TestRenderCarriesTheWorkersOwnToken(t *testing.T) {
	r, err := talos.New(settings())
	if err != nil {
		t.Fatal(err)
	}
	const own = "w0rk3r.0123456789abcdef"
	token := func(name, class string) string {
		t.Helper()
		in := input(name, class, "/dev/sda")
		in.KubeBootstrapToken = own
		cfg, err := r.Render(in)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := configloader.NewFromBytes(cfg.Data)
		if err != nil {
			t.Fatal(err)
		}
		tok := parsed.Cluster().Token()
		return tok.ID() + "." + tok.Secret()
	}
	if got := token("worker-01", "worker"); got != own {
		t.Errorf("the worker's cluster.token is %q, want its own", got)
	}
	if got := token("cp-01", "control-plane"); got == own || got == "." {
		t.Errorf("the control plane's cluster.token is %q, want the cluster's", got)
	}
}
