package config

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/tomlfile"
)

// Fleetd is fleetd.toml.
type Fleetd struct {
	// PKIDir holds the files `fleetd init` wrote.
	PKIDir string `toml:"pki_dir"`
	// DataDir holds the embedded store and other state.
	DataDir string `toml:"data_dir"`
	// Listen is the gRPC address (JoinService, Gateway, Admin).
	Listen string `toml:"listen"`
	// HTTPListen serves /.well-known/nodetrust.json over HTTPS; empty
	// disables it.
	HTTPListen string `toml:"http_listen"`
	// AdvertiseAddresses are the gRPC addresses (host:port) of every
	// replica of this control plane, named in the well-known document so
	// that nodes move to another when one is down (docs/ha.md).
	AdvertiseAddresses []string `toml:"advertise_addresses"`
	// NodeCertLifetime is the lifetime of node certificates; at most 24h.
	NodeCertLifetime Duration `toml:"node_cert_lifetime"`
	// TokenTTL is the default lifetime of join tokens; MaxTokenTTL caps
	// what `fleetd token create --ttl` may ask for.
	TokenTTL    Duration `toml:"token_ttl"`
	MaxTokenTTL Duration `toml:"max_token_ttl"`
	// RenewalLimit renewals per node are allowed in any RenewalWindow
	// (default 6 per hour).
	RenewalLimit  int      `toml:"renewal_limit"`
	RenewalWindow Duration `toml:"renewal_window"`
	// RamdiskRoles name roles whose certificates live at most 2h
	// (default ["ramdisk"]).
	RamdiskRoles []string `toml:"ramdisk_roles"`
	// PendingPoll is how often a node waiting for approval polls.
	PendingPoll Duration `toml:"pending_poll"`
	// LogLevel is debug, info, warn or error.
	LogLevel  string    `toml:"log_level"`
	Store     Store     `toml:"store"`
	TPM       TPM       `toml:"tpm"`
	Inventory Inventory `toml:"inventory"`
	Limits    Limits    `toml:"limits"`
	// BootPolicy configures measured boot (docs/boot-policy.md).
	BootPolicy BootPolicy `toml:"boot_policy"`
	// Actuator receives cordon requests (docs/boot-policy.md).
	Actuator Actuator `toml:"actuator"`
	PKCS11   PKCS11   `toml:"pkcs11"`
	// TLSKeyExchanges are the TLS 1.3 key exchanges the server offers, in
	// order of preference: X25519MLKEM768 (hybrid post-quantum), X25519,
	// P256, P384. Empty means Go's default (X25519MLKEM768 first, then the
	// classic ones). docs/performance.md measures both kinds.
	TLSKeyExchanges []string `toml:"tls_key_exchanges"`
	// DebugListen, when set, serves the process's memory figures
	// (runtime/metrics) and Go's profiler over plain HTTP on this address,
	// which must be a loopback one. Off by default.
	DebugListen string `toml:"debug_listen"`
	// Export configures the SPIRE registration export (docs/spire.md).
	Export Export `toml:"export"`
	// Render configures each machine class's renderer, by class name
	// ([render.CLASS]; docs/install.md).
	Render map[string]Render `toml:"render"`
	// Intake configures the install environment's intake
	// (docs/install.md, "Intake").
	Intake Intake `toml:"intake"`
	// Install configures the Install RPC's admission and render
	// (docs/install.md, "Admission").
	Install Install `toml:"install"`
	// Tinkerbell configures the Tinkerbell objects of each issued install
	// (docs/install.md, "Tinkerbell").
	Tinkerbell Tinkerbell `toml:"tinkerbell"`
	// Kubernetes configures what fleetd does in the workers' cluster
	// (docs/kubernetes.md); without a kubeconfig, nothing.
	Kubernetes Kubernetes `toml:"kubernetes"`

	// path is the file this was read from; relative paths resolve
	// against its directory.
	path string
}

// TPM configures the tpm attestor.
type TPM struct {
	// EKRoots are PEM files of TPM manufacturers' root certificates an EK
	// certificate must chain to; none means only EKs already pinned for a
	// node can join with the tpm attestor.
	EKRoots []string `toml:"ek_roots"`
	// EKIntermediates are PEM files of manufacturer intermediates.
	EKIntermediates []string `toml:"ek_intermediates"`
	// EKRootsDir is a folder of vendor CA certificates (roots and
	// intermediates, told apart by fleetd): the manufacturer root bundle
	// `fleetd ek-roots check` checks. It adds to EKRoots and
	// EKIntermediates; a bundle with an error stops the start.
	EKRootsDir string `toml:"ek_roots_dir"`
	// RequireEKCertificateAndPin makes a tpm join need both a trusted EK
	// certificate and an EK already known (pinned for a node, or bound by
	// a declaration); either alone is refused.
	RequireEKCertificateAndPin bool `toml:"require_ek_certificate_and_pin"`
	// ChallengeTTL is how long a challenge round may be answered.
	ChallengeTTL Duration `toml:"challenge_ttl"`
}

// Inventory configures the declared inventory and admission
// (docs/inventory.md, docs/lifecycle.md).
type Inventory struct {
	// Required makes a join of any kind of a machine the inventory does
	// not declare wait as a claim; false (the default) keeps undeclared
	// token joins working.
	Required bool `toml:"required"`
	// AutoProvision lets a planned worker's first TPM join start its
	// installation; never a control plane's.
	AutoProvision bool `toml:"auto_provision"`
	// Classes are the machine classes a declaration may name (default
	// worker, control-plane, install-environment).
	Classes []string `toml:"classes"`
	// Source is where declarations come from: "fleetd" (the default;
	// fleetd inventory apply) or "netbox".
	Source string `toml:"source"`
	// MaxClaims bounds the claims kept; the oldest go first (default
	// 10000).
	MaxClaims int    `toml:"max_claims"`
	NetBox    NetBox `toml:"netbox"`
}

// NetBox is the NetBox inventory source.
type NetBox struct {
	// URL is NetBox's base URL (https://netbox.example.org).
	URL string `toml:"url"`
	// TokenFile holds the API token (mode 0600); never in this file.
	TokenFile string `toml:"token_file"`
	// DeclarerUser is the NetBox user whose changes alone make an EK
	// binding honoured (the object-change log is read).
	DeclarerUser string `toml:"declarer_user"`
	// CAFile, when set, is the PEM CA that NetBox's certificate chains to.
	CAFile string `toml:"ca_file"`
	// Timeout bounds each NetBox call (default 10s).
	Timeout Duration `toml:"timeout"`
}

// Limits bound what hostile traffic can cost the control plane
// (docs/security.md). Zero values take the defaults.
type Limits struct {
	// MaxConnections is the most gRPC connections held at once, live node
	// sessions included (default 16384, lowered to fit the open-file
	// limit when not set).
	MaxConnections int `toml:"max_connections"`
	// MaxConnectionsPerSource is the most one source address (an IPv6
	// /64) holds (default 256).
	MaxConnectionsPerSource int `toml:"max_connections_per_source"`
	// MaxHandshakes is the most connections held whose TLS handshake has
	// not finished (default 1024).
	MaxHandshakes int `toml:"max_handshakes"`
	// HTTPMaxConnections is the most HTTPS connections (default 1024).
	HTTPMaxConnections int `toml:"http_max_connections"`
	// HandshakeTimeout bounds a connection's TLS handshake (default 10s).
	HandshakeTimeout Duration `toml:"handshake_timeout"`
	// IdleTimeout closes a connection that carries no stream (default
	// 1m); a live node session is a stream and is never closed by it.
	IdleTimeout Duration `toml:"idle_timeout"`
	// KeepaliveTime and KeepaliveTimeout: a quiet connection is pinged
	// after KeepaliveTime and closed if the ping goes unanswered for
	// KeepaliveTimeout (defaults 1m and 20s).
	KeepaliveTime    Duration `toml:"keepalive_time"`
	KeepaliveTimeout Duration `toml:"keepalive_timeout"`
	// RefusalLogBurst refusal lines per reason and source are logged in
	// each RefusalLogWindow (defaults 5 and 1m); one summary line says
	// how many were dropped.
	RefusalLogBurst  int      `toml:"refusal_log_burst"`
	RefusalLogWindow Duration `toml:"refusal_log_window"`
	// RefusalAuditWindow: at most one audit record per token and refusal
	// reason in each window (default 10m).
	RefusalAuditWindow Duration `toml:"refusal_audit_window"`
}

// Intake is the [intake] section: how an intake in the install
// environment is judged and how long what it issues lasts.
type Intake struct {
	// Class is the class whose boot policy judges an intake's boot: the
	// install environment's (default "install-environment").
	Class string `toml:"class"`
	// Window is how long an intake's LDevID, LAK certificate and session
	// last, the install window (default 2h; 5m to 24h).
	Window Duration `toml:"window"`
}

// Install is the [install] section: the bounds of an install request's
// network report, and the join credential a render carries.
type Install struct {
	// ReportMaxAge bounds how old a network report may be (default 15m;
	// 1m to 24h); ReportMaxSkew how far in the future it, or the
	// confirmation, may be dated (default 2m; 0s to 1h).
	ReportMaxAge  Duration `toml:"report_max_age"`
	ReportMaxSkew Duration `toml:"report_max_skew"`
	// CredentialLifetime is how long the join credential of a render is
	// accepted (default 8h; 1h to 7 days).
	CredentialLifetime Duration `toml:"credential_lifetime"`
	// ConfigTTL is how long a rendered config waits for its fetch with
	// the install code (default 4h; 10m to 48h). It is at most
	// CredentialLifetime, so a config is never released with a join
	// credential that is already dead.
	ConfigTTL Duration `toml:"config_ttl"`
	// Server is the gRPC address (host:port) installed machines reach,
	// written in their rendered config (default the first of
	// advertise_addresses, else listen).
	Server string `toml:"server"`
}

// DefaultStaleAfter is [boot_policy] stale_after's default: two missed
// hourly boot checks (each moved by up to a tenth) and a margin.
const DefaultStaleAfter = 150 * time.Minute

// BootPolicy configures the boot policies and the verdict log.
type BootPolicy struct {
	// Dir is the policy directory: one TOML file per machine class.
	// Relative to fleetd.toml's folder.
	Dir string `toml:"dir"`
	// VerdictLogMaxBytes is the size at which verdicts.jsonl in data_dir
	// rotates (default 10 MiB, at least 64 KiB); VerdictLogKeep is how
	// many rotated files are kept (default 5, at most 100).
	VerdictLogMaxBytes int64 `toml:"verdict_log_max_bytes"`
	VerdictLogKeep     int   `toml:"verdict_log_keep"`
	// VerdictsKept is how many verdicts the store keeps per node, for
	// fleetd nodes verdicts (default 50).
	VerdictsKept int `toml:"verdicts_kept"`
	// ControlPlaneClasses are the classes whose failed boot checks only
	// alert (default ["control-plane"]); any other class is quarantined.
	ControlPlaneClasses []string `toml:"control_plane_classes"`
	// BootCheckTimeout is how long a node has to answer a nonce with its
	// boot evidence (default 1m); no answer is not evidence.
	BootCheckTimeout Duration `toml:"boot_check_timeout"`
	// StaleAfter is how old a node's last boot verdict may be before the
	// node is stale: an alert, no state change (default 2h30m: two
	// missed hourly boot checks and a margin).
	StaleAfter Duration `toml:"stale_after"`
}

// Actuator kinds, [actuator] kind.
const (
	ActuatorWebhook    = "webhook"
	ActuatorKubernetes = "kubernetes"
)

// Actuator says where cordon requests go when a worker is quarantined by
// its boot policy (docs/boot-policy.md).
type Actuator struct {
	// Kind is "webhook" (a JSON POST to WebhookURL) or "kubernetes" (the
	// Node is cordoned through [kubernetes]'s kubeconfig, and uncordoned
	// at release). Empty: "webhook" when WebhookURL is set, else none.
	Kind string `toml:"kind"`
	// WebhookURL receives each request as a JSON POST; empty: none.
	WebhookURL string `toml:"webhook_url"`
	// WebhookTimeout bounds one request (default 10s).
	WebhookTimeout Duration `toml:"webhook_timeout"`
}

// Kubernetes is the [kubernetes] section: the workers' cluster, which
// fleetd acts on (docs/kubernetes.md). Without a kubeconfig fleetd takes
// no Kubernetes action. The bootstrap tokens live in kube-system, the one
// namespace the API server reads them from.
type Kubernetes struct {
	// Kubeconfig is a kubeconfig file for fleetd's identity in the
	// cluster (deploy/kubernetes/fleetd.yaml's ServiceAccount, or one
	// with its rights), mode 0600: it holds a credential. Relative to
	// fleetd.toml's folder.
	Kubeconfig string `toml:"kubeconfig"`
	// TokenLifetime is how long a worker's own bootstrap token, which
	// its rendered config carries, is accepted (default 8h; 1h to 7
	// days): as long as the join credential beside it, by default.
	TokenLifetime Duration `toml:"token_lifetime"`
	// DrainTimeout bounds the drain of a retired worker (default 2m; 5s
	// to 1h): evictions a PodDisruptionBudget refuses are retried until
	// then, and the drain is then reported as failed and tried again.
	DrainTimeout Duration `toml:"drain_timeout"`
	// RetireRetry is the wait before a retirement whose Kubernetes part
	// failed (the API server down, a drain timed out) is tried again
	// (default 1m; 1s to 1h).
	RetireRetry Duration `toml:"retire_retry"`
}

// Enabled reports whether [kubernetes] names a cluster.
func (k *Kubernetes) Enabled() bool { return k.Kubeconfig != "" }

// PKCS11 says how to reach the PKCS#11 tokens that hold keys of the PKI
// (docs/pki.md). A key's own URI (its <use>.keyref in pki_dir) may name
// its module and PIN file instead; the URI wins.
type PKCS11 struct {
	// Module is the PKCS#11 library (an absolute path).
	Module string `toml:"module"`
	// PINFile holds the token's user PIN (one line, mode 0600); never
	// the PIN itself in this file or on a command line.
	PINFile string `toml:"pin_file"`
}

// Store selects the control plane's store: the embedded SQLite file (the
// default), or a PostgreSQL database that several replicas share. In
// fleetd.toml it is either a table ([store] with driver and path, or url)
// or a string, the PostgreSQL URL alone:
//
//	store = "postgres://fleetd@db.example.org:5432/fleetd?sslmode=verify-full"
//
// The URL never carries the password: it comes from password_file, or from
// libpq's PGPASSWORD or PGPASSFILE in fleetd's environment, so it appears
// in no config and no log line.
type Store struct {
	// Driver is "sqlite" (the default) or "postgres" (the default when
	// URL is set).
	Driver string `toml:"driver"`
	// Path is the SQLite file; default <data_dir>/fleetd.db.
	Path string `toml:"path"`
	// URL is the PostgreSQL connection URL (postgres://user@host:port/db?…),
	// without a password.
	URL string `toml:"url"`
	// PasswordFile holds the PostgreSQL role's password (one line; mode
	// 0600 or 0400).
	PasswordFile string `toml:"password_file"`
	// MaxConns bounds this replica's connections to PostgreSQL (default 16).
	MaxConns int `toml:"max_conns"`
}

// UnmarshalTOML takes the store setting as a PostgreSQL URL string or as a
// table.
func (s *Store) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case string:
		*s = Store{Driver: "postgres", URL: v}
		return nil
	case map[string]any:
		for k, val := range v {
			var ok bool
			switch k {
			case "driver":
				s.Driver, ok = val.(string)
			case "path":
				s.Path, ok = val.(string)
			case "url":
				s.URL, ok = val.(string)
			case "password_file":
				s.PasswordFile, ok = val.(string)
			case "max_conns":
				var n int64
				n, ok = val.(int64)
				s.MaxConns = int(n)
			default:
				return fmt.Errorf("store: unknown setting store.%s", k)
			}
			if !ok {
				return fmt.Errorf("store.%s: wrong type %T", k, val)
			}
		}
		return nil
	}
	return fmt.Errorf("store: want a PostgreSQL URL or a table, not %T", v)
}

// String describes the store for the log: the driver and the file or the
// URL (which carries no password).
func (s Store) String() string {
	if s.Driver == "postgres" {
		return "postgres " + s.URL
	}
	return "sqlite " + s.Path
}

// Limits on node certificate lifetimes (DESIGN.md section 2).
const (
	MaxNodeCertLifetime = 24 * time.Hour
	MinNodeCertLifetime = 2 * time.Second
)

// LoadFleetd reads and validates fleetd.toml.
func LoadFleetd(path string) (*Fleetd, error) {
	var c Fleetd
	if err := tomlfile.Decode(path, &c); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w (write one, or start a development server with 'fleetd dev')", err)
		}
		return nil, err
	}
	c.path = path
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

func (c *Fleetd) applyDefaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8443"
	}
	if c.NodeCertLifetime.Duration == 0 {
		c.NodeCertLifetime.Duration = MaxNodeCertLifetime
	}
	if c.TokenTTL.Duration == 0 {
		c.TokenTTL.Duration = time.Hour
	}
	if c.MaxTokenTTL.Duration == 0 {
		c.MaxTokenTTL.Duration = 30 * 24 * time.Hour
	}
	if c.RenewalLimit == 0 {
		c.RenewalLimit = 6
	}
	if c.RenewalWindow.Duration == 0 {
		c.RenewalWindow.Duration = time.Hour
	}
	if c.RamdiskRoles == nil {
		c.RamdiskRoles = []string{"ramdisk"}
	}
	if c.TPM.ChallengeTTL.Duration == 0 {
		c.TPM.ChallengeTTL.Duration = time.Minute
	}
	if c.PendingPoll.Duration == 0 {
		c.PendingPoll.Duration = 2 * time.Second
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.BootPolicy.VerdictLogMaxBytes == 0 {
		c.BootPolicy.VerdictLogMaxBytes = bootpolicy.DefaultVerdictLogMaxBytes
	}
	if c.BootPolicy.VerdictLogKeep == 0 {
		c.BootPolicy.VerdictLogKeep = bootpolicy.DefaultVerdictLogKeep
	}
	if c.BootPolicy.VerdictsKept == 0 {
		c.BootPolicy.VerdictsKept = 50
	}
	if c.BootPolicy.ControlPlaneClasses == nil {
		c.BootPolicy.ControlPlaneClasses = []string{"control-plane"}
	}
	if c.BootPolicy.StaleAfter.Duration == 0 {
		c.BootPolicy.StaleAfter.Duration = DefaultStaleAfter
	}
	if c.Intake.Class == "" {
		c.Intake.Class = "install-environment"
	}
	if c.Intake.Window.Duration == 0 {
		c.Intake.Window.Duration = 2 * time.Hour
	}
	if c.Install.ReportMaxAge.Duration == 0 {
		c.Install.ReportMaxAge.Duration = 15 * time.Minute
	}
	if c.Install.ReportMaxSkew.Duration == 0 {
		c.Install.ReportMaxSkew.Duration = 2 * time.Minute
	}
	if c.Install.CredentialLifetime.Duration == 0 {
		c.Install.CredentialLifetime.Duration = 8 * time.Hour
	}
	if c.Install.ConfigTTL.Duration == 0 {
		c.Install.ConfigTTL.Duration = 4 * time.Hour
	}
	if c.Install.Server == "" {
		c.Install.Server = c.Listen
		if len(c.AdvertiseAddresses) > 0 {
			c.Install.Server = c.AdvertiseAddresses[0]
		}
	}
	if c.BootPolicy.BootCheckTimeout.Duration == 0 {
		c.BootPolicy.BootCheckTimeout.Duration = time.Minute
	}
	if c.Actuator.WebhookTimeout.Duration == 0 {
		c.Actuator.WebhookTimeout.Duration = 10 * time.Second
	}
	if c.Actuator.Kind == "" && c.Actuator.WebhookURL != "" {
		c.Actuator.Kind = ActuatorWebhook
	}
	if c.Kubernetes.TokenLifetime.Duration == 0 {
		c.Kubernetes.TokenLifetime.Duration = 8 * time.Hour
	}
	if c.Kubernetes.DrainTimeout.Duration == 0 {
		c.Kubernetes.DrainTimeout.Duration = 2 * time.Minute
	}
	if c.Kubernetes.RetireRetry.Duration == 0 {
		c.Kubernetes.RetireRetry.Duration = time.Minute
	}
	if c.Store.Driver == "" {
		c.Store.Driver = "sqlite"
		if c.Store.URL != "" {
			c.Store.Driver = "postgres"
		}
	}
	if c.Inventory.Source == "" {
		c.Inventory.Source = "fleetd"
	}
	if c.Inventory.Classes == nil {
		c.Inventory.Classes = []string{"worker", "control-plane", "install-environment"}
	}
	if c.Inventory.MaxClaims == 0 {
		c.Inventory.MaxClaims = 10000
	}
	if c.Inventory.NetBox.Timeout.Duration == 0 {
		c.Inventory.NetBox.Timeout.Duration = 10 * time.Second
	}
	c.Export.applyDefaults()
	c.Tinkerbell.applyDefaults()
	if c.Store.Driver == "sqlite" && c.Store.Path == "" && c.DataDir != "" {
		c.Store.Path = filepath.Join(c.DataDir, "fleetd.db")
	}
}

// Validate reports the first invalid setting by name.
func (c *Fleetd) Validate() error {
	if c.PKIDir == "" {
		return errors.New("pki_dir is required: the folder 'fleetd init --dir' wrote")
	}
	if c.DataDir == "" {
		return errors.New("data_dir is required: a folder for the store")
	}
	if err := c.Export.validate(); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen: want host:port: %w", err)
	}
	if c.HTTPListen != "" {
		if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
			return fmt.Errorf("http_listen: want host:port: %w", err)
		}
	}
	for _, a := range c.AdvertiseAddresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("advertise_addresses: %q: want host:port: %w", a, err)
		}
	}
	if d := c.NodeCertLifetime.Duration; d < MinNodeCertLifetime || d > MaxNodeCertLifetime {
		return fmt.Errorf("node_cert_lifetime: %s is outside %s..%s", d, MinNodeCertLifetime, MaxNodeCertLifetime)
	}
	if c.TokenTTL.Duration <= 0 || c.TokenTTL.Duration > c.MaxTokenTTL.Duration {
		return fmt.Errorf("token_ttl: %s must be positive and at most max_token_ttl (%s)", c.TokenTTL.Duration, c.MaxTokenTTL.Duration)
	}
	if c.RenewalLimit < 1 {
		return fmt.Errorf("renewal_limit: %d must be at least 1", c.RenewalLimit)
	}
	if c.RenewalWindow.Duration <= 0 {
		return errors.New("renewal_window must be positive")
	}
	if c.PendingPoll.Duration < time.Second {
		return fmt.Errorf("pending_poll: %s is shorter than the 1s nodes wait at least", c.PendingPoll.Duration)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log_level: %q is not one of debug, info, warn, error", c.LogLevel)
	}
	if err := c.Limits.validate(); err != nil {
		return err
	}
	if _, err := c.KeyExchanges(); err != nil {
		return err
	}
	if c.DebugListen != "" {
		if err := loopbackAddress(c.DebugListen); err != nil {
			return fmt.Errorf("debug_listen: %w", err)
		}
	}
	if n := c.BootPolicy.VerdictLogMaxBytes; n < bootpolicy.MinVerdictLogMaxBytes {
		return fmt.Errorf("boot_policy.verdict_log_max_bytes: %d is below %d", n, bootpolicy.MinVerdictLogMaxBytes)
	}
	if n := c.BootPolicy.VerdictLogKeep; n < 1 || n > bootpolicy.MaxVerdictLogKeep {
		return fmt.Errorf("boot_policy.verdict_log_keep: %d is outside 1..%d", n, bootpolicy.MaxVerdictLogKeep)
	}
	if n := c.BootPolicy.VerdictsKept; n < 1 || n > 10000 {
		return fmt.Errorf("boot_policy.verdicts_kept: %d is outside 1..10000", n)
	}
	if d := c.BootPolicy.BootCheckTimeout.Duration; d < time.Second || d > time.Hour {
		return fmt.Errorf("boot_policy.boot_check_timeout: %s is outside 1s..1h", d)
	}
	if d := c.BootPolicy.StaleAfter.Duration; d < time.Minute || d > 30*24*time.Hour {
		return fmt.Errorf("boot_policy.stale_after: %s is outside 1m..720h", d)
	}
	if d := c.Intake.Window.Duration; d < 5*time.Minute || d > 24*time.Hour {
		return fmt.Errorf("intake.window: %s is outside 5m..24h", d)
	}
	if d := c.Install.ReportMaxAge.Duration; d < time.Minute || d > 24*time.Hour {
		return fmt.Errorf("install.report_max_age: %s is outside 1m..24h", d)
	}
	if d := c.Install.ReportMaxSkew.Duration; d < 0 || d > time.Hour {
		return fmt.Errorf("install.report_max_skew: %s is outside 0s..1h", d)
	}
	if d := c.Install.CredentialLifetime.Duration; d < time.Hour || d > 7*24*time.Hour {
		return fmt.Errorf("install.credential_lifetime: %s is outside 1h..168h", d)
	}
	if d := c.Install.ConfigTTL.Duration; d < 10*time.Minute || d > 48*time.Hour {
		return fmt.Errorf("install.config_ttl: %s is outside 10m..48h", d)
	}
	if c.Install.ConfigTTL.Duration > c.Install.CredentialLifetime.Duration {
		return fmt.Errorf("install.config_ttl (%s) is longer than install.credential_lifetime (%s): a late fetch would release a config whose join credential is dead; shorten config_ttl or lengthen credential_lifetime",
			c.Install.ConfigTTL.Duration, c.Install.CredentialLifetime.Duration)
	}
	if err := c.validateKubernetes(); err != nil {
		return err
	}
	if c.PKCS11.Module != "" && !filepath.IsAbs(c.PKCS11.Module) {
		return fmt.Errorf("pkcs11.module: %q is not an absolute path (SoftHSM2: /usr/lib/softhsm/libsofthsm2.so)", c.PKCS11.Module)
	}
	if err := c.Store.validate(); err != nil {
		return err
	}
	if err := c.Inventory.validate(); err != nil {
		return err
	}
	if err := c.Tinkerbell.validate(c.HTTPListen); err != nil {
		return err
	}
	return c.validateRender()
}

func (s *Store) validate() error {
	switch s.Driver {
	case "sqlite":
		if s.URL != "" || s.PasswordFile != "" {
			return errors.New("store: url and password_file are PostgreSQL settings; set driver = \"postgres\" or remove them")
		}
	case "postgres":
		u, err := url.Parse(s.URL)
		switch {
		case s.URL == "":
			return errors.New("store.url: the PostgreSQL URL is required with driver = \"postgres\"")
		case err != nil:
			return errors.New("store.url: not a URL (want postgres://user@host:port/database)")
		case u.Scheme != "postgres" && u.Scheme != "postgresql":
			return fmt.Errorf("store.url: scheme %q: want postgres://user@host:port/database", u.Scheme)
		}
		if _, ok := u.User.Password(); ok || u.Query().Has("password") {
			// Not echoed: the value is a secret.
			return errors.New("store.url: the URL carries a password; remove it and put it in store.password_file (mode 0600), or in PGPASSWORD or PGPASSFILE in fleetd's environment")
		}
		if s.Path != "" {
			return errors.New("store.path is the SQLite file; with PostgreSQL remove it")
		}
		if s.MaxConns < 0 {
			return fmt.Errorf("store.max_conns: %d must not be negative", s.MaxConns)
		}
	default:
		return fmt.Errorf("store.driver: %q is not supported (use \"sqlite\" or \"postgres\")", s.Driver)
	}
	return nil
}

func (inv *Inventory) validate() error {
	if len(inv.Classes) == 0 {
		return errors.New("inventory.classes: name at least one class")
	}
	for _, cl := range inv.Classes {
		if err := validClass(cl); err != nil {
			return fmt.Errorf("inventory.classes: %w", err)
		}
	}
	if inv.MaxClaims < 1 {
		return fmt.Errorf("inventory.max_claims: %d must be at least 1", inv.MaxClaims)
	}
	switch inv.Source {
	case "fleetd":
	case "netbox":
		nb := inv.NetBox
		switch {
		case nb.URL == "":
			return errors.New("inventory.netbox.url is required with source = \"netbox\"")
		case nb.TokenFile == "":
			return errors.New("inventory.netbox.token_file is required with source = \"netbox\" (a file holding the API token)")
		case nb.DeclarerUser == "":
			return errors.New("inventory.netbox.declarer_user is required with source = \"netbox\": the user whose EK bindings are honoured")
		case nb.Timeout.Duration <= 0:
			return errors.New("inventory.netbox.timeout must be positive")
		}
		if u, err := url.Parse(nb.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("inventory.netbox.url: %q is not an http(s) URL", nb.URL)
		}
	default:
		return fmt.Errorf("inventory.source: %q is not \"fleetd\" or \"netbox\"", inv.Source)
	}
	return nil
}

// validClass checks a class name: a lower-case letter or digit first,
// then letters, digits and '-', at most 63 characters.
func validClass(s string) error {
	if s == "" || len(s) > 63 {
		return fmt.Errorf("class %q must be 1 to 63 characters", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && c == '-') {
			return fmt.Errorf("class %q: lower-case letters, digits and '-' only", s)
		}
	}
	return nil
}

// Resolve makes a path from the file relative to the file's folder.
func (c *Fleetd) Resolve(p string) string {
	if p == "" || filepath.IsAbs(p) || c.path == "" {
		return p
	}
	return filepath.Join(filepath.Dir(c.path), p)
}

// AdminAddress is the address admin commands dial: Listen, with an
// unspecified host replaced by loopback.
func (c *Fleetd) AdminAddress() string {
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return c.Listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// Duration is a duration setting, written as a Go duration string ("24h").
type Duration = tomlfile.Duration

// validate reports the first negative limit by name; zero takes the
// default.
func (l *Limits) validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"max_connections", l.MaxConnections}, {"max_connections_per_source", l.MaxConnectionsPerSource},
		{"max_handshakes", l.MaxHandshakes}, {"http_max_connections", l.HTTPMaxConnections},
		{"refusal_log_burst", l.RefusalLogBurst},
	} {
		if f.v < 0 {
			return fmt.Errorf("limits.%s: %d must be positive (or unset for the default)", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"handshake_timeout", l.HandshakeTimeout.Duration}, {"idle_timeout", l.IdleTimeout.Duration},
		{"keepalive_time", l.KeepaliveTime.Duration}, {"keepalive_timeout", l.KeepaliveTimeout.Duration},
		{"refusal_log_window", l.RefusalLogWindow.Duration}, {"refusal_audit_window", l.RefusalAuditWindow.Duration},
	} {
		if f.v < 0 {
			return fmt.Errorf("limits.%s: %s must be positive (or unset for the default)", f.name, f.v)
		}
	}
	if l.MaxConnections > 0 && l.MaxConnectionsPerSource > l.MaxConnections {
		return fmt.Errorf("limits.max_connections_per_source: %d is above max_connections (%d)", l.MaxConnectionsPerSource, l.MaxConnections)
	}
	return nil
}

// keyExchanges are the names tls_key_exchanges takes.
var keyExchanges = map[string]tls.CurveID{
	"X25519MLKEM768": tls.X25519MLKEM768,
	"X25519":         tls.X25519,
	"P256":           tls.CurveP256,
	"P384":           tls.CurveP384,
}

// KeyExchanges returns the curve preferences of tls_key_exchanges; nil
// means Go's default.
func (c *Fleetd) KeyExchanges() ([]tls.CurveID, error) {
	var ids []tls.CurveID
	for _, n := range c.TLSKeyExchanges {
		id, ok := keyExchanges[n]
		if !ok {
			return nil, fmt.Errorf("tls_key_exchanges: %q is not one of X25519MLKEM768, X25519, P256, P384", n)
		}
		if slices.Contains(ids, id) {
			return nil, fmt.Errorf("tls_key_exchanges: %q is named twice", n)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// loopbackAddress refuses an address that is not host:port with a
// loopback host (an IP address or "localhost").
func loopbackAddress(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address (127.0.0.1, ::1 or localhost): the debug endpoint has no authentication", addr)
	}
	return nil
}

// validateKubernetes checks [kubernetes] and [actuator] kind, which needs
// it.
func (c *Fleetd) validateKubernetes() error {
	k := c.Kubernetes
	if d := k.TokenLifetime.Duration; d < time.Hour || d > 7*24*time.Hour {
		return fmt.Errorf("kubernetes.token_lifetime: %s is outside 1h..168h", d)
	}
	if d := k.DrainTimeout.Duration; d < 5*time.Second || d > time.Hour {
		return fmt.Errorf("kubernetes.drain_timeout: %s is outside 5s..1h", d)
	}
	if d := k.RetireRetry.Duration; d < time.Second || d > time.Hour {
		return fmt.Errorf("kubernetes.retire_retry: %s is outside 1s..1h", d)
	}
	switch c.Actuator.Kind {
	case "":
	case ActuatorWebhook:
		if c.Actuator.WebhookURL == "" {
			return errors.New("actuator.webhook_url is required with kind = \"webhook\"")
		}
	case ActuatorKubernetes:
		if c.Actuator.WebhookURL != "" {
			return errors.New("actuator.webhook_url: kind = \"kubernetes\" cordons through [kubernetes]; remove webhook_url or set kind = \"webhook\"")
		}
		if !k.Enabled() {
			return errors.New("actuator.kind = \"kubernetes\" needs kubernetes.kubeconfig: the cluster whose Nodes it cordons")
		}
	default:
		return fmt.Errorf("actuator.kind: %q is not \"webhook\" or \"kubernetes\"", c.Actuator.Kind)
	}
	return nil
}
