package talos

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/constants"

	"github.com/nodetrust/nodetrust/internal/fleetd/render"
)

// ContentType is a Talos machine config's media type.
const ContentType = "application/yaml"

// DefaultBCDDir is where the machine files for bcd go: under /var, the one
// tree Talos creates machine files in.
const DefaultBCDDir = "/var/etc/bcd"

// The machine files a render writes into the BCD directory: bcd reads
// config.toml, the join encryption key beside it, and the join token
// beside it (join-token, the file bcd join and bcd doctor look for).
const (
	BCDConfigFile   = "config.toml"
	JWKFile         = "join-encryption.jwk"
	CredentialFile  = "join-token"
	bcdDataDir      = "/var/lib/bcd"
	credentialMode  = 0o600
	publicFilesMode = 0o644
)

// Settings configure one class's Talos renders. The names in errors are
// the keys of fleetd.toml's [render.CLASS] section.
type Settings struct {
	// ClusterName and ClusterEndpoint (https://host:port of the
	// Kubernetes API) name the cluster the nodes join.
	ClusterName     string
	ClusterEndpoint string
	// SecretsFile is the cluster's secrets bundle, generated once
	// (GenerateSecrets, `fleetd render secrets`).
	SecretsFile string
	// KubernetesVersion defaults to machinery's (1.34.1 at v1.11.5).
	KubernetesVersion string
	// TalosVersion is the version contract the configs are for ("v1.11");
	// default: machinery's own.
	TalosVersion string
	// InstallImage is the installer image; empty, the config names none
	// and Talos's default applies.
	InstallImage string
	// ControlPlaneRoles are the roles rendered as control planes (default
	// ["control-plane"]); any other role is a worker.
	ControlPlaneRoles []string
	// BCDDir is the folder of bcd's machine files (default DefaultBCDDir);
	// it must be under /var/.
	BCDDir string
}

// Renderer renders Talos machine configs for one class.
type Renderer struct {
	s        Settings
	contract *config.VersionContract
	bundle   *secrets.Bundle
}

// metal is machinery's metal runtime mode: the config must say how to
// install (Talos's own metal platform mode is not in the machinery module).
type metal struct{}

func (metal) String() string        { return "metal" }
func (metal) RequiresInstall() bool { return true }
func (metal) InContainer() bool     { return false }

// MetalMode is the validation mode renders are checked in.
var MetalMode = metal{}

// New checks s and loads its secrets bundle. Errors name the setting.
func New(s Settings) (*Renderer, error) {
	if s.ClusterName == "" {
		return nil, errors.New("cluster_name is required: the Talos cluster's name")
	}
	u, err := url.Parse(s.ClusterEndpoint)
	if s.ClusterEndpoint == "" || err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("cluster_endpoint: %q is not https://host:port, the Kubernetes API's address", s.ClusterEndpoint)
	}
	if s.KubernetesVersion == "" {
		s.KubernetesVersion = constants.DefaultKubernetesVersion
	}
	if s.ControlPlaneRoles == nil {
		s.ControlPlaneRoles = []string{"control-plane"}
	}
	if s.BCDDir == "" {
		s.BCDDir = DefaultBCDDir
	}
	if !strings.HasPrefix(s.BCDDir, "/var/") || path.Clean(s.BCDDir) != s.BCDDir {
		return nil, fmt.Errorf("bcd_dir: %q must be a clean path under /var/: Talos creates machine files nowhere else", s.BCDDir)
	}
	r := &Renderer{s: s}
	if s.TalosVersion != "" {
		if r.contract, err = config.ParseContractFromVersion(s.TalosVersion); err != nil {
			return nil, fmt.Errorf("talos_version: %q: %w", s.TalosVersion, err)
		}
	}
	if s.SecretsFile == "" {
		return nil, errors.New("secrets_file is required: generate it once with 'fleetd render secrets --out FILE'")
	}
	if err := checkPrivate(s.SecretsFile); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("secrets_file: %w: make it once with 'fleetd render secrets --out FILE'", err)
	} else if err != nil {
		return nil, fmt.Errorf("secrets_file: %w", err)
	}
	if r.bundle, err = secrets.LoadBundle(s.SecretsFile); err != nil {
		return nil, fmt.Errorf("secrets_file: read the secrets bundle: %w", err)
	}
	if err := r.bundle.Validate(); err != nil {
		return nil, fmt.Errorf("secrets_file: %s is not a complete secrets bundle (%v): generate one with 'fleetd render secrets --out FILE'", s.SecretsFile, err)
	}
	return r, nil
}

// checkPrivate refuses a secrets file others may read.
func checkPrivate(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s has mode %04o; it holds the cluster's keys: chmod 600 %s", p, fi.Mode().Perm(), p)
	}
	return nil
}

// Render renders in's Talos machine config and validates it in metal mode.
func (r *Renderer) Render(in render.Input) (render.Config, error) {
	if err := render.Check(in); err != nil {
		return render.Config{}, err
	}
	n := in.Node
	if err := validHostname(n.Name); err != nil {
		return render.Config{}, &render.FieldError{Node: n.Name, Field: "name", Reason: "cannot be a Talos hostname: " + err.Error()}
	}
	typ := machine.TypeWorker
	if slices.Contains(r.s.ControlPlaneRoles, n.Role) {
		typ = machine.TypeControlPlane
	}
	opts := []generate.Option{
		generate.WithVersionContract(r.contract),
		generate.WithSecretsBundle(r.bundle),
		generate.WithInstallDisk(n.InstallDisk),
	}
	if r.s.InstallImage != "" {
		opts = append(opts, generate.WithInstallImage(r.s.InstallImage))
	}
	gen, err := generate.NewInput(r.s.ClusterName, r.s.ClusterEndpoint, r.s.KubernetesVersion, opts...)
	if err != nil {
		return render.Config{}, r.fail(in, "prepare", err)
	}
	cfg, err := gen.Config(typ)
	if err != nil {
		return render.Config{}, r.fail(in, "generate", err)
	}
	files, err := r.machineFiles(in)
	if err != nil {
		return render.Config{}, r.fail(in, "write bcd's files", err)
	}
	raw := cfg.RawV1Alpha1()
	if raw.MachineConfig.MachineNetwork == nil {
		raw.MachineConfig.MachineNetwork = &v1alpha1.NetworkConfig{}
	}
	raw.MachineConfig.MachineNetwork.NetworkHostname = n.Name
	raw.MachineConfig.MachineFiles = append(raw.MachineConfig.MachineFiles, files...)
	if typ == machine.TypeWorker && in.KubeBootstrapToken != "" {
		// The worker's kubelet joins with its own token, which fleetd's
		// approver honours for this node alone, once (docs/kubernetes.md).
		raw.ClusterConfig.BootstrapToken = in.KubeBootstrapToken
	}
	if _, err := cfg.Validate(MetalMode); err != nil {
		return render.Config{}, r.fail(in, "validate", err)
	}
	data, err := cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return render.Config{}, r.fail(in, "encode", err)
	}
	return render.Config{Data: data, ContentType: ContentType, CredentialExpires: in.CredentialExpires}, nil
}

// fail wraps a machinery error; its text never carries the credential.
func (r *Renderer) fail(in render.Input, step string, err error) error {
	msg := in.Redact(err.Error())
	return fmt.Errorf("render node %s: Talos %s: %s", in.Node.Name, step, msg)
}

// bcdConfig is the part of bcd's config.toml a render writes: how to reach
// the control plane and whom to trust.
type bcdConfig struct {
	Server               string `toml:"server"`
	ServerName           string `toml:"server_name,omitempty"`
	DataDir              string `toml:"data_dir"`
	Role                 string `toml:"role,omitempty"`
	ServingCASPKIPin     string `toml:"serving_ca_spki_pin"`
	JoinSigningKeyPin    string `toml:"join_signing_key_pin"`
	JoinEncryptionKeyPin string `toml:"join_encryption_key_pin"`
}

// machineFiles are bcd's files: config.toml and the join encryption key
// (0644, public), and the join credential (0600, root's: machined writes
// machine files as root, and bcd join runs as root).
func (r *Renderer) machineFiles(in render.Input) ([]*v1alpha1.MachineFile, error) {
	f := in.Fleetd
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(bcdConfig{
		Server: f.Server, ServerName: f.ServerName, DataDir: bcdDataDir, Role: in.Node.Role,
		ServingCASPKIPin: f.ServingCASPKIPin, JoinSigningKeyPin: f.JoinSigningKeyPin, JoinEncryptionKeyPin: f.JoinEncryptionKeyPin,
	}); err != nil {
		return nil, err
	}
	file := func(name, content string, mode uint32) *v1alpha1.MachineFile {
		return &v1alpha1.MachineFile{FileContent: content, FilePermissions: v1alpha1.FileMode(mode), FilePath: path.Join(r.s.BCDDir, name), FileOp: "create"}
	}
	files := []*v1alpha1.MachineFile{file(BCDConfigFile, b.String(), publicFilesMode)}
	if f.JoinEncryptionJWK != "" {
		files = append(files, file(JWKFile, f.JoinEncryptionJWK, publicFilesMode))
	}
	return append(files, file(CredentialFile, in.Credential, credentialMode)), nil
}

// validHostname checks a node name as a hostname: dot-separated labels
// of lower-case letters, digits and '-', none starting or ending with '-',
// each at most 63 bytes. Node ids may hold '_', which hostnames may not.
func validHostname(s string) error {
	if len(s) > 253 {
		return errors.New("longer than 253 bytes")
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return errors.New("each dot-separated label needs 1 to 63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("a label may not start or end with '-'")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("%q is not allowed (letters, digits and '-' only)", c)
			}
		}
	}
	return nil
}
