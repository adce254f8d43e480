package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/nodetrust/nodetrust/pki"

	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/tomlfile"
)

// DefaultBCDConfig and DefaultBCDDataDir are where bcd looks when no flag
// names another place.
const (
	DefaultBCDConfig  = "/etc/bcd/config.toml"
	DefaultBCDDataDir = "/var/lib/bcd"
	// JWKFile is the join encryption key, beside config.toml.
	JWKFile = "join-encryption.jwk"
)

// BCD is the node's config.toml. Pins are written by the install script
// from the control plane's pki-bundle.json.
type BCD struct {
	// Server is the control plane's gRPC address, host:port.
	Server string `toml:"server"`
	// Servers are more addresses of the same control plane (its other
	// replicas): bcd uses one at a time and moves to another when it is
	// down, for joins, renewals and its session. The control plane's
	// well-known document may name more.
	Servers []string `toml:"servers"`
	// ServerName is the name checked in the serving certificate; default:
	// the host part of Server.
	ServerName string `toml:"server_name"`
	DataDir    string `toml:"data_dir"`
	Role       string `toml:"role"`

	ServingCASPKIPin     string `toml:"serving_ca_spki_pin"`
	JoinSigningKeyPin    string `toml:"join_signing_key_pin"`
	JoinEncryptionKeyPin string `toml:"join_encryption_key_pin"`

	// TPM is "auto" (the default: /dev/tpmrm0 when present), "off", a
	// device path, or tcp://host:port (swtpm).
	TPM string `toml:"tpm"`

	// SessionTransport is how bcd node holds its live session: "framed"
	// (the default: the framed session, or gRPC at a control plane that
	// does not offer it) or "grpc" (the gRPC Session always).
	SessionTransport string `toml:"session_transport"`

	Renewal Renewal `toml:"renewal"`

	// BootCheck configures the boot evidence bcd node sends on its live
	// session (a TPM node whose certificate names an AK).
	BootCheck BootCheck `toml:"boot_check"`

	// Join says how bcd join proves this machine.
	Join Join `toml:"join"`

	// Helper, when its user is set, puts the TPM behind bcd helper: the
	// unprivileged bcd node never opens the TPM device.
	Helper Helper `toml:"helper"`

	// LocalAPI, Federation and Leases configure the signed-call side of
	// bcd node (docs/local-api.md).
	LocalAPI   LocalAPI   `toml:"local_api"`
	Federation Federation `toml:"federation"`
	Leases     Leases     `toml:"leases"`

	// Parsed pins, filled by Validate.
	Pins Pins `toml:"-"`

	path string
}

// Renewal tunes when the agent renews; the defaults follow the seed.
type Renewal struct {
	// Fraction of a certificate's lifetime after which it is renewed
	// (default 0.6).
	Fraction float64 `toml:"fraction"`
	// BackoffMin and BackoffMax bound the wait after a failed renewal
	// (default 30s and 10m).
	BackoffMin Duration `toml:"backoff_min"`
	BackoffMax Duration `toml:"backoff_max"`
}

// BootCheck configures the node's periodic boot evidence: a quote of PCRs
// 0-7 by the AK its certificate names over a nonce the control plane
// gives, with the boot's event log (docs/boot-policy.md).
type BootCheck struct {
	// Interval between boot checks, with up to a tenth of jitter either
	// way (default 1h; at least 1s).
	Interval Duration `toml:"interval"`
	// EventLog is the measurement log sent with each quote (default
	// /sys/kernel/security/tpm0/binary_bios_measurements); a missing file
	// sends none.
	EventLog string `toml:"event_log"`
}

// DefaultEventLog is where Linux exposes the firmware's TPM event log.
const DefaultEventLog = "/sys/kernel/security/tpm0/binary_bios_measurements"

// Join configures bcd join (and so the shipped bcd-join.service).
type Join struct {
	// Attestor is how the machine proves itself: "token" (the default) or
	// "tpm", the TPM's EK, which lets a machine the control plane knows
	// join again without a token (after a reinstall). bcd join --attestor
	// overrides it.
	Attestor string `toml:"attestor"`
}

// The attestors bcd join speaks.
const (
	AttestorToken = "token"
	AttestorTPM   = "tpm"
)

// ValidAttestor checks an attestor name, naming where it came from.
func ValidAttestor(setting, a string) error {
	if a != AttestorToken && a != AttestorTPM {
		return fmt.Errorf("%s: %q is not an attestor; use %q or %q", setting, a, AttestorToken, AttestorTPM)
	}
	return nil
}

// LocalAPI is bcd node's local API, which the command line and the
// instances of this machine call.
type LocalAPI struct {
	// Socket is the path of the unix socket (mode 0600, in a directory of
	// mode 0700); default: <data_dir>/run/bcd.sock.
	Socket string `toml:"socket"`
	// Namespace is the namespace calls are signed for, here and by the
	// other machines of a federation; default: the trust domain of the
	// node certificate.
	Namespace string `toml:"namespace"`
}

// Federation is where bcd node takes the calls of the daemons of other
// machines, and where it finds them.
type Federation struct {
	// Listen is host:port of the federation listener (TCP with TLS, the
	// node certificate as server certificate); empty: the daemon takes no
	// call of another machine.
	Listen string `toml:"listen"`
	// Peers maps node ids to the federation addresses of their daemons,
	// for calls to them; an active launch may name more.
	Peers map[string]string `toml:"peers"`
}

// Leases are the resources bcd node leases to its clients.
type Leases struct {
	// Resources are the names of the resources; default: gpu0, gpu1, …
	// for each NVIDIA GPU the machine reports.
	Resources []string `toml:"resources"`
}

// Addresses are the control plane's addresses: server, then servers,
// each once.
func (c *BCD) Addresses() []string {
	var out []string
	for _, a := range append([]string{c.Server}, c.Servers...) {
		if a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// Layout is the data directory's layout (data_dir, else the default).
func (c *BCD) Layout() datadir.Layout { return datadir.Layout(c.dataDir()) }

// SocketPath is [local_api] socket, or <data_dir>/run/bcd.sock.
func (c *BCD) SocketPath() string {
	if c.LocalAPI.Socket != "" {
		return c.LocalAPI.Socket
	}
	return c.Layout().Socket()
}

func (c *BCD) dataDir() string {
	if c.DataDir == "" {
		return DefaultBCDDataDir
	}
	return c.DataDir
}

// validateCalls checks [local_api], [federation] and [leases].
func (c *BCD) validateCalls() error {
	if ns := c.LocalAPI.Namespace; ns != "" {
		for i := 0; i < len(ns); i++ {
			ch := ns[i]
			alnum := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9'
			if !alnum && (i == 0 || ch != '.' && ch != '_' && ch != '-') || len(ns) > 255 {
				return fmt.Errorf("local_api.namespace: %q: want 1 to 255 letters, digits, '.', '_' or '-', a letter or digit first", ns)
			}
		}
	}
	if l := c.Federation.Listen; l != "" {
		if _, _, err := net.SplitHostPort(l); err != nil {
			return fmt.Errorf("federation.listen: want host:port: %w", err)
		}
	}
	for node, addr := range c.Federation.Peers {
		if err := pki.ValidNodeID(node); err != nil {
			return fmt.Errorf("federation.peers: %w", err)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("federation.peers.%s: want host:port: %w", node, err)
		}
	}
	seen := map[string]bool{}
	for _, r := range c.Leases.Resources {
		if r == "" || len(r) > 63 || seen[r] {
			return fmt.Errorf("leases.resources: %q is empty, longer than 63 bytes or listed twice", r)
		}
		seen[r] = true
	}
	return nil
}

// Helper configures bcd helper, the root process that owns the TPM.
type Helper struct {
	// User is the unprivileged user bcd node runs as; only it (and root)
	// may call the helper. Empty: no helper, bcd opens the TPM itself.
	User string `toml:"user"`
	// Socket is the helper's unix socket (default /run/bcd/helper.sock).
	Socket string `toml:"socket"`
	// HostconfigDir is root's folder for the verified join response
	// (default /var/lib/bcd-hostconfig).
	HostconfigDir string `toml:"hostconfig_dir"`
}

// Enabled reports whether the [helper] section names a user.
func (h Helper) Enabled() bool { return h.User != "" }

// IDs returns the uid and primary gid of the [helper] user (a name or a
// number).
func (h Helper) IDs() (uid, gid uint32, err error) {
	u, err := user.Lookup(h.User)
	if err != nil {
		if _, nerr := strconv.Atoi(h.User); nerr == nil {
			u, err = user.LookupId(h.User)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("[helper] user %q: %w (create it, or name an existing user)", h.User, err)
		}
	}
	id, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("[helper] user %q: uid %q: %w", h.User, u.Uid, err)
	}
	g, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("[helper] user %q: gid %q: %w", h.User, u.Gid, err)
	}
	return uint32(id), uint32(g), nil
}

// HelperSocket is bcd helper's socket when the [helper] section is set,
// else "". Under [helper] even root goes through the helper, which owns
// the TPM (a TPM without a resource manager serves one connection).
func (c *BCD) HelperSocket() string {
	if !c.Helper.Enabled() {
		return ""
	}
	return c.Helper.Socket
}

// Pins are the three trust anchors a node starts from.
type Pins struct {
	ServingCA      pki.Pin
	JoinSigning    pki.Pin
	JoinEncryption pki.Pin
}

// LoadBCD reads and validates config.toml.
func LoadBCD(path string) (*BCD, error) {
	var c BCD
	if err := tomlfile.Decode(path, &c); err != nil {
		return nil, err
	}
	c.path = path
	if c.DataDir == "" {
		c.DataDir = DefaultBCDDataDir
	}
	if c.TPM == "" {
		c.TPM = "auto"
	}
	if c.Join.Attestor == "" {
		c.Join.Attestor = AttestorToken
	}
	if c.Helper.Socket == "" {
		c.Helper.Socket = "/run/bcd/helper.sock"
	}
	if c.Helper.HostconfigDir == "" {
		c.Helper.HostconfigDir = "/var/lib/bcd-hostconfig"
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

// Validate parses the pins and checks the addresses, naming the setting
// that is wrong.
func (c *BCD) Validate() error {
	if c.Server == "" && len(c.Servers) == 0 {
		return errors.New("server is required: the control plane's host:port")
	}
	if c.Server != "" {
		if _, _, err := net.SplitHostPort(c.Server); err != nil {
			return fmt.Errorf("server: want host:port: %w", err)
		}
	}
	for _, s := range c.Servers {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return fmt.Errorf("servers: %q: want host:port: %w", s, err)
		}
	}
	if c.ServerName == "" {
		c.ServerName, _, _ = net.SplitHostPort(c.Addresses()[0])
	}
	switch c.SessionTransport {
	case "", "framed", "grpc":
	default:
		return fmt.Errorf("session_transport: %q: want framed or grpc", c.SessionTransport)
	}
	if f := c.Renewal.Fraction; f != 0 && (f < 0.05 || f > 0.95) {
		return fmt.Errorf("renewal.fraction: %g is outside 0.05..0.95", f)
	}
	if c.Renewal.BackoffMin.Duration < 0 || c.Renewal.BackoffMax.Duration < c.Renewal.BackoffMin.Duration && c.Renewal.BackoffMax.Duration != 0 {
		return errors.New("renewal.backoff_min and backoff_max: want 0 <= backoff_min <= backoff_max")
	}
	if d := c.BootCheck.Interval.Duration; d != 0 && (d < time.Second || d > 24*time.Hour) {
		return fmt.Errorf("boot_check.interval: %s is outside 1s..24h", d)
	}
	if c.BootCheck.EventLog != "" && !filepath.IsAbs(c.BootCheck.EventLog) {
		return fmt.Errorf("boot_check.event_log: %q is not an absolute path", c.BootCheck.EventLog)
	}
	if c.Join.Attestor != "" {
		if err := ValidAttestor("join.attestor", c.Join.Attestor); err != nil {
			return err
		}
	}
	if err := c.validateCalls(); err != nil {
		return err
	}
	var err error
	if c.Pins, err = ParsePins(
		NamedPin{"serving_ca_spki_pin", c.ServingCASPKIPin},
		NamedPin{"join_signing_key_pin", c.JoinSigningKeyPin},
		NamedPin{"join_encryption_key_pin", c.JoinEncryptionKeyPin},
	); err != nil {
		return err
	}
	return nil
}

// NamedPin is a pin's value with the name the operator wrote it under
// (a setting or a flag), for error messages.
type NamedPin struct{ Name, Value string }

// ParsePins parses the serving CA, join signing and join encryption pins,
// in that order. A missing or malformed pin is an error naming it.
func ParsePins(serving, signing, encryption NamedPin) (Pins, error) {
	var out [3]pki.Pin
	for i, np := range []NamedPin{serving, signing, encryption} {
		if np.Value == "" {
			return Pins{}, fmt.Errorf("%s is required (from the control plane's pki-bundle.json)", np.Name)
		}
		pin, err := pki.ParsePin(np.Value)
		if err != nil {
			return Pins{}, fmt.Errorf("%s: %w", np.Name, err)
		}
		out[i] = pin
	}
	return Pins{ServingCA: out[0], JoinSigning: out[1], JoinEncryption: out[2]}, nil
}

// JWKPath is join-encryption.jwk beside the config file.
func (c *BCD) JWKPath() string {
	if c.path == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(c.path), JWKFile)
}

// ReadJWK returns the join encryption key beside the config file, or nil
// when there is none (the caller then takes it from the well-known
// document).
func (c *BCD) ReadJWK() ([]byte, error) {
	p := c.JWKPath()
	if p == "" {
		return nil, nil
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return b, nil
}

// Duration is a duration setting, written as a Go duration string ("24h").
type Duration = tomlfile.Duration
