package load

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/pki"
)

// Config is one run of the load tool.
type Config struct {
	// Nodes is the number of simulated nodes (default 1000).
	Nodes int
	// Concurrency bounds the operations in flight (default 64).
	Concurrency int
	// Renewals is how many times each node renews over its session
	// (default 2; 0 skips the phase).
	Renewals int
	// Revoke is how many nodes are revoked while every session is held;
	// negative means 10% of Nodes, at least one.
	Revoke int

	// Fleetd is the fleetd binary to start; empty finds it next to this
	// program, else in PATH.
	Fleetd string
	// ServerConfig, when set, names the fleetd.toml of a running server
	// to target instead of starting one: its address, pki_dir (owner
	// credential and pins) and renewal_limit are read from it.
	ServerConfig string
	// Server overrides the address read from ServerConfig; several,
	// comma-separated, are replicas on one database: each connection takes
	// the next, admin calls go to the first.
	Server string
	// ServerPIDs are the running server's processes (one per replica:
	// the server columns sum them); none looks for the local process
	// listening on the first address's port.
	ServerPIDs []int
	// KEM is the join encryption KEM of a started server.
	KEM string
	// PKCS11 are the --pkcs11 values a started server's fleetd init gets
	// (keys made inside PKCS#11 tokens); PKCS11Module and PKCS11PINFile
	// go into its fleetd.toml's [pkcs11] section.
	PKCS11        []string
	PKCS11Module  string
	PKCS11PINFile string
	// KeyExchanges is the started server's tls_key_exchanges, comma
	// separated (X25519MLKEM768, X25519, P256, P384); empty is Go's
	// default, the hybrid first. The floor's handshakes use the same.
	KeyExchanges string
	// ServerDebug is a targeted server's debug_listen address, for its
	// heap; a started server always gets one.
	ServerDebug string
	// SessionTransport is the sessions' transport: "framed" (the
	// default; gRPC, counted, where the server refuses it) or "grpc".
	SessionTransport string
	// Role and Site of the tokens.
	Role string
	Site string

	// Timeout bounds one operation (a join, a session's opening, a
	// renewal, a revocation's notice).
	Timeout time.Duration
	// Retries is how many times a retryable failure (UNAVAILABLE,
	// RESOURCE_EXHAUSTED with a short pushback) is tried again.
	Retries int
	// Settle is how long held sessions rest before their memory is read,
	// and how long the run watches for wrongly ended sessions after the
	// revocations.
	Settle time.Duration
	// FloorTime is spent measuring each item of the crypto floor.
	FloorTime time.Duration
	// Keep keeps a started server's folder.
	Keep bool
	// JSON, when set, is the file the report is written to.
	JSON string

	// Out receives the report's tables; Log receives warnings; Progress,
	// when not nil, receives the progress line (\r updates).
	Out      io.Writer
	Log      io.Writer
	Progress io.Writer

	con *console
}

func (c *Config) defaults() {
	if c.Nodes == 0 {
		c.Nodes = 1000
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Revoke < 0 {
		c.Revoke = max(1, c.Nodes/10)
	}
	if c.KEM == "" {
		c.KEM = pki.KEMP256
	}
	if c.Role == "" {
		c.Role = "load"
	}
	if c.SessionTransport == "" {
		c.SessionTransport = transportFramed
	}
	if c.Timeout == 0 {
		c.Timeout = time.Minute
	}
	if c.Settle == 0 {
		c.Settle = 2 * time.Second
	}
	if c.FloorTime == 0 {
		c.FloorTime = 300 * time.Millisecond
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	c.con = newConsole(c.Log, c.Progress)
}

func (c *Config) validate() error {
	switch {
	case c.Nodes < 1:
		return fmt.Errorf("--nodes %d: want at least 1", c.Nodes)
	case c.Concurrency < 1:
		return fmt.Errorf("--concurrency %d: want at least 1", c.Concurrency)
	case c.Renewals < 0:
		return fmt.Errorf("--renewals %d: want 0 or more", c.Renewals)
	case c.Revoke > c.Nodes:
		return fmt.Errorf("--revoke %d: more than the %d nodes", c.Revoke, c.Nodes)
	case c.SessionTransport != transportFramed && c.SessionTransport != transportGRPC:
		return fmt.Errorf("--session-transport %q: want framed or grpc", c.SessionTransport)
	case c.Retries < 0:
		return fmt.Errorf("--retries %d: want 0 or more", c.Retries)
	case len(c.PKCS11) > 0 && c.ServerConfig != "":
		return errors.New("--pkcs11 sets up a server the tool starts; a running server (--config) has its keys where its PKI says")
	case c.Server != "" && c.ServerConfig == "":
		return errors.New("--server needs --config: the running server's fleetd.toml (for its pki_dir)")
	case c.Timeout <= 0 || c.Settle < 0 || c.FloorTime <= 0:
		return errors.New("--timeout and --floor-time must be positive, --settle not negative")
	case c.KeyExchanges != "" && c.ServerConfig != "":
		return errors.New("--tls-key-exchanges sets up a server the tool starts; a running server (--config) offers its tls_key_exchanges")
	case c.ServerDebug != "" && c.ServerConfig == "":
		return errors.New("--server-debug needs --config: a started server's debug endpoint is the tool's own")
	}
	if _, _, err := c.keyExchanges(); err != nil {
		return fmt.Errorf("--tls-key-exchanges: %w", err)
	}
	return nil
}

// keyExchanges returns the names and curve ids of --tls-key-exchanges;
// none for Go's default.
func (c *Config) keyExchanges() ([]string, []tls.CurveID, error) {
	if c.KeyExchanges == "" {
		return nil, nil, nil
	}
	names := strings.Split(c.KeyExchanges, ",")
	for i := range names {
		names[i] = strings.TrimSpace(names[i])
	}
	ids, err := (&config.Fleetd{TLSKeyExchanges: names}).KeyExchanges()
	return names, ids, err
}

func (c *Config) warnf(format string, args ...any) {
	c.con.println("nodetrust-load: " + fmt.Sprintf(format, args...))
}

// usageError is a command-line mistake (exit 2).
type usageError struct{ error }

// parseArgs reads the command line into a Config.
func parseArgs(args []string, stdout, stderr io.Writer) (*Config, error) {
	c := &Config{}
	fs := pflag.NewFlagSet("nodetrust-load", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.Nodes, "nodes", 1000, "simulated nodes, each with its own key and hardware claims")
	fs.IntVar(&c.Concurrency, "concurrency", 64, "operations in flight at once")
	fs.IntVar(&c.Renewals, "renewals", 2, "renewals per node over its live session (0 skips the phase)")
	fs.IntVar(&c.Revoke, "revoke", -1, "nodes revoked while all sessions are held (default 10% of --nodes)")
	fs.StringVar(&c.Fleetd, "fleetd", "", "fleetd binary to start (default: fleetd next to this program, else in PATH)")
	fs.StringVar(&c.ServerConfig, "config", "", "target the running server of this fleetd.toml instead of starting one")
	fs.StringVar(&c.Server, "server", "", "with --config: the server's address, when not the one in fleetd.toml; several, comma-separated, for replicas on one database (connections take them in turn; admin calls go to the first)")
	fs.IntSliceVar(&c.ServerPIDs, "server-pid", nil, "with --config: the server's process id; several, comma-separated, for replicas (the server columns sum them) (default: the local process listening on the first address's port)")
	fs.StringVar(&c.KEM, "kem", pki.KEMP256, "join encryption KEM of the started server: p256 or mlkem768-p256")
	fs.StringArrayVar(&c.PKCS11, "pkcs11", nil, "a started server makes its keys in a PKCS#11 token: passed to fleetd init --pkcs11 (repeatable; see docs/pki.md)")
	fs.StringVar(&c.PKCS11Module, "pkcs11-module", "", "with --pkcs11: the PKCS#11 module, for the started server's [pkcs11] module")
	fs.StringVar(&c.PKCS11PINFile, "pkcs11-pin-file", "", "with --pkcs11: the file holding the token's PIN (mode 0600), for [pkcs11] pin_file")
	fs.StringVar(&c.KeyExchanges, "tls-key-exchanges", "", "TLS key exchanges of the started server (its tls_key_exchanges), comma-separated: X25519MLKEM768, X25519, P256, P384 (default Go's: the hybrid X25519MLKEM768 first)")
	fs.StringVar(&c.ServerDebug, "server-debug", "", "with --config: the server's debug_listen address, to read its heap (a started server always has one)")
	fs.StringVar(&c.SessionTransport, "session-transport", transportFramed, "the live sessions' transport: framed (the framed session; gRPC where the server refuses it, counted) or grpc")
	fs.StringVar(&c.Role, "role", "load", "role of the join tokens")
	fs.StringVar(&c.Site, "site", "", "site of the join tokens")
	fs.DurationVar(&c.Timeout, "timeout", time.Minute, "longest wait for one operation")
	fs.IntVar(&c.Retries, "retries", 3, "retries of a retryable failure (UNAVAILABLE, short pushback)")
	fs.DurationVar(&c.Settle, "settle", 2*time.Second, "rest before reading held sessions' memory, and watch after the revocations")
	fs.DurationVar(&c.FloorTime, "floor-time", 300*time.Millisecond, "time spent measuring each item of the crypto floor")
	fs.BoolVar(&c.Keep, "keep", false, "keep the started server's folder (PKI, fleetd.toml, store)")
	fs.StringVar(&c.JSON, "json", "", "write the report as JSON to this file")
	quiet := fs.Bool("quiet", false, "no progress line")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: nodetrust-load [flags]\n\nDrives simulated nodes through joins, live sessions, renewals and revocations against\na fleetd it starts (or a running one, --config) and reports rates, latencies and the\nserver's CPU and memory next to the crypto floor. See docs/performance.md.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	// Zero takes the default in a Config; on the command line it is a
	// mistake.
	if c.Nodes < 1 || c.Concurrency < 1 {
		return nil, usageError{fmt.Errorf("--nodes and --concurrency must be at least 1")}
	}
	c.Out, c.Log = stdout, stderr
	if !*quiet {
		c.Progress = stderr
	}
	return c, nil
}

// Main runs the tool with the command line args and returns its exit
// code: 0 when every correctness check passed, 1 when one failed or the
// run could not be made, 2 for a command-line mistake.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseArgs(args, stdout, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "nodetrust-load: %v\n", err)
		return 2
	}
	check := *c
	check.defaults()
	if err := check.validate(); err != nil {
		fmt.Fprintf(stderr, "nodetrust-load: %v\n", err)
		return 2
	}
	rep, err := Run(ctx, *c)
	if err != nil {
		fmt.Fprintf(stderr, "nodetrust-load: %v\n", err)
		return 1
	}
	if !rep.OK {
		fmt.Fprintln(stderr, "nodetrust-load: a correctness check failed (see above)")
		return 1
	}
	return 0
}
