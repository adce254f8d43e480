package render

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Renderer renders one class's machine config.
type Renderer interface {
	// Render fills the class's config with in. A declaration that lacks
	// a field the config needs is refused with a *FieldError.
	Render(in Input) (Config, error)
}

// Input is what a render is filled with.
type Input struct {
	// Node is the machine as declared.
	Node Node
	// Credential is the per-node join credential the caller made, opaque
	// here; it is a secret and never appears in an error.
	Credential string
	// CredentialExpires is when Credential stops being accepted (hours
	// after the render).
	CredentialExpires time.Time
	// Fleetd is how the installed machine reaches the control plane.
	Fleetd Fleetd
	// KubeBootstrapToken is the worker's own Kubernetes bootstrap token
	// ("<id>.<secret>", docs/kubernetes.md), with which its kubelet joins
	// the cluster; a secret, never in an error. Empty: the render keeps
	// the cluster's own token (no [kubernetes], or a control plane).
	KubeBootstrapToken string
}

// Redact replaces the secrets of in (the join credential, the bootstrap
// token) in msg.
func (in Input) Redact(msg string) string {
	if in.Credential != "" {
		msg = strings.ReplaceAll(msg, in.Credential, "[join credential]")
	}
	if in.KubeBootstrapToken != "" {
		msg = strings.ReplaceAll(msg, in.KubeBootstrapToken, "[bootstrap token]")
	}
	return msg
}

// Node is a declared machine's facts (store.Declaration).
type Node struct {
	// Name is the node id, and the installed machine's hostname.
	Name        string
	Serial      string
	ProductUUID string
	MACs        []string
	Class       string
	Site        string
	// Role is the declared role, or the class when none is declared.
	Role string
	// InstallDisk is the device the installer writes to (/dev/…).
	InstallDisk   string
	SwitchChassis string
	SwitchPort    string
}

// Fleetd is what a node's bcd needs to reach the control plane: its
// address and the three pins of the control plane's bundle
// (pki-bundle.json), and the join encryption key (join-encryption.jwk).
type Fleetd struct {
	// Server is the gRPC address, host:port.
	Server string
	// ServerName is the name the serving certificate is checked for;
	// empty: Server's host.
	ServerName           string
	ServingCASPKIPin     string
	JoinSigningKeyPin    string
	JoinEncryptionKeyPin string
	// JoinEncryptionJWK is the join encryption key as a JWK (JSON).
	JoinEncryptionJWK string
}

// Config is a rendered machine config.
type Config struct {
	Data []byte
	// ContentType is the media type Data is served with.
	ContentType string
	// CredentialExpires is when the join credential Data carries expires:
	// the config is of no use after it.
	CredentialExpires time.Time
}

// FromDeclaration is the Node of a declaration: the role defaults to the
// class, as the certificate's role does (docs/inventory.md).
func FromDeclaration(d store.Declaration) Node {
	role := d.Role
	if role == "" {
		role = d.Class
	}
	return Node{
		Name: d.Name, Serial: d.Serial, ProductUUID: d.ProductUUID, MACs: slices.Clone(d.MACs),
		Class: d.Class, Site: d.Site, Role: role, InstallDisk: d.InstallDisk,
		SwitchChassis: d.SwitchChassis, SwitchPort: d.SwitchPort,
	}
}

// FieldError is a render refused because a declared field is missing or
// invalid. Field is the inventory's name of it (docs/inventory.md), or
// "join credential" or a fleetd setting for what the caller supplies.
type FieldError struct {
	Node   string
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("render node %s: %s %s: fix the declaration (docs/inventory.md) and render again", e.Node, e.Field, e.Reason)
}

// ErrNoRenderer is returned for a class no renderer is configured for.
var ErrNoRenderer = errors.New("no renderer for the class")

// Check refuses an input that no renderer can fill: a node without a
// name, a class or a valid install disk, a missing credential or its
// expiry, or a control plane without an address. Every renderer calls it
// first.
func Check(in Input) error {
	n := in.Node
	missing := func(field string) error {
		return &FieldError{Node: n.Name, Field: field, Reason: "is missing"}
	}
	switch {
	case n.Name == "":
		return missing("name")
	case n.Class == "":
		return missing("class")
	case n.InstallDisk == "":
		return missing("install_disk")
	}
	if err := ValidInstallDisk(n.InstallDisk); err != nil {
		return &FieldError{Node: n.Name, Field: "install_disk", Reason: err.Error()}
	}
	switch {
	case in.Credential == "":
		return &FieldError{Node: n.Name, Field: "join credential", Reason: "is missing (the caller makes one per render)"}
	case in.CredentialExpires.IsZero():
		return &FieldError{Node: n.Name, Field: "join credential", Reason: "has no expiry"}
	case in.Fleetd.Server == "":
		return &FieldError{Node: n.Name, Field: "fleetd server address", Reason: "is missing"}
	}
	return nil
}

// MaxInstallDiskLen bounds an install disk's path.
const MaxInstallDiskLen = 256

// ValidInstallDisk checks an install disk: an absolute device path under
// /dev/ ("/dev/sda", "/dev/disk/by-id/…"), printable, without white space
// or "..", at most MaxInstallDiskLen bytes. The error does not repeat the
// value.
func ValidInstallDisk(s string) error {
	switch {
	case len(s) > MaxInstallDiskLen:
		return fmt.Errorf("is %d bytes, more than %d", len(s), MaxInstallDiskLen)
	case !strings.HasPrefix(s, "/dev/") || len(s) == len("/dev/"):
		return errors.New(`must be a device path under /dev/ ("/dev/sda", "/dev/disk/by-id/…")`)
	case slices.Contains(strings.Split(s, "/"), ".."):
		return errors.New(`must not contain ".."`)
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return errors.New("must not contain white space or control characters")
		}
	}
	return nil
}

// Registry is the renderer of each class.
type Registry struct {
	byClass map[string]Renderer
}

// NewRegistry makes a registry of renderers by class name.
func NewRegistry(byClass map[string]Renderer) *Registry {
	m := make(map[string]Renderer, len(byClass))
	for k, v := range byClass {
		m[k] = v
	}
	return &Registry{byClass: m}
}

// Classes lists the classes that have a renderer, sorted.
func (r *Registry) Classes() []string {
	out := make([]string, 0, len(r.byClass))
	for k := range r.byClass {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Render renders in with its class's renderer; a class without one is
// refused (ErrNoRenderer).
func (r *Registry) Render(in Input) (Config, error) {
	rr, ok := r.byClass[in.Node.Class]
	if !ok {
		return Config{}, fmt.Errorf("render node %s: class %q: %w: add a [render.%s] section to fleetd.toml", in.Node.Name, in.Node.Class, ErrNoRenderer, in.Node.Class)
	}
	return rr.Render(in)
}
