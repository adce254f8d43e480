package bcdcli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/agent"
	"github.com/nodetrust/nodetrust/config"
	"github.com/nodetrust/nodetrust/hwclaims"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/version"
)

// claimsRootEnv points hardware claims at another folder tree than the
// host's (a development knob: tests join many nodes from one machine).
const claimsRootEnv = "NODETRUST_DEBUG_CLAIMS_ROOT"

type joinFlags struct {
	config, server, serverName, dataDir string
	servingPin, signingPin, encPin      string
	role, nodeID, tokenFile, attestor   string
	logLevel                            string
}

func joinCommand() *cobra.Command {
	var f joinFlags
	c := &cobra.Command{
		Use:   "join",
		Short: "Join the control plane and store this machine's identity",
		Long: `join creates this machine's identity: a P-256 key and a certificate from the
control plane. The join token comes from exactly one source: standard input,
--token-file, or the BCD_JOIN_TOKEN environment variable — never the command line.

On a machine whose identity loads, join reads no token, prints "already joined
as …" and exits 0, so it can run on every boot.

Without a config file, --server, the three pin flags and --data-dir bootstrap
the machine from the control plane's well-known document.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				// Never echo the argument: it may be a token.
				return cli.Usagef("bcd join takes no arguments; pass the join token on standard input, with --token-file or in %s, never on the command line", TokenEnv)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return runJoin(cmd, f) },
	}
	fl := c.Flags()
	fl.StringVar(&f.config, "config", config.DefaultBCDConfig, "path of config.toml")
	fl.StringVar(&f.server, "server", "", "control plane host:port, to bootstrap without config.toml (with the three pin flags)")
	fl.StringVar(&f.serverName, "server-name", "", "name checked in the serving certificate (default: the host of --server)")
	fl.StringVar(&f.dataDir, "data-dir", "", "where the identity lives (default: data_dir of config.toml, else "+config.DefaultBCDDataDir+")")
	fl.StringVar(&f.servingPin, "serving-ca-spki-pin", "", "pin of the serving CA (with --server)")
	fl.StringVar(&f.signingPin, "join-signing-key-pin", "", "pin of the JoinService signing key (with --server)")
	fl.StringVar(&f.encPin, "join-encryption-key-pin", "", "pin of the join encryption key (with --server)")
	fl.StringVar(&f.role, "role", "", "role to join as (default: role of config.toml, else the token's)")
	fl.StringVar(&f.nodeID, "node-id", "", "node id to join as (default: the token's, or one the control plane picks)")
	fl.StringVar(&f.tokenFile, "token-file", "", "read the join token from this file")
	fl.StringVar(&f.attestor, "attestor", "token", "how the machine proves itself: token")
	fl.StringVar(&f.logLevel, "log-level", "warn", "debug, info, warn or error")
	return c
}

func runJoin(cmd *cobra.Command, f joinFlags) error {
	if f.attestor != "token" {
		return cli.Usagef("--attestor %q is not supported; use token", f.attestor)
	}
	jc := agent.JoinConfig{
		Role:    f.role,
		NodeID:  f.nodeID,
		Version: version.Version,
		Logger:  cli.NewLogger(cmd.ErrOrStderr(), f.logLevel),
	}
	if f.server != "" {
		pins, err := config.ParsePins(
			config.NamedPin{Name: "--serving-ca-spki-pin", Value: f.servingPin},
			config.NamedPin{Name: "--join-signing-key-pin", Value: f.signingPin},
			config.NamedPin{Name: "--join-encryption-key-pin", Value: f.encPin},
		)
		if err != nil {
			return cli.Usagef("%v", err)
		}
		b := config.BCD{Server: f.server, ServerName: f.serverName, ServingCASPKIPin: f.servingPin, JoinSigningKeyPin: f.signingPin, JoinEncryptionKeyPin: f.encPin}
		if err := b.Validate(); err != nil {
			return cli.Usagef("--server: %v", err)
		}
		jc.Server, jc.ServerName, jc.Pins = b.Server, b.ServerName, pins
		jc.DataDir = f.dataDir
		if jc.DataDir == "" {
			jc.DataDir = config.DefaultBCDDataDir
		}
	} else {
		cfg, err := config.LoadBCD(f.config)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("no config at %s: run the install script, or pass --server with the three pin flags and --data-dir", f.config)
		}
		if err != nil {
			return err
		}
		jwk, err := cfg.ReadJWK()
		if err != nil {
			return err
		}
		jc.Server, jc.ServerName, jc.Pins, jc.JWK = cfg.Server, cfg.ServerName, cfg.Pins, jwk
		jc.DataDir = cfg.DataDir
		if f.dataDir != "" {
			jc.DataDir = f.dataDir
		}
		if jc.Role == "" {
			jc.Role = cfg.Role
		}
	}
	if err := checkDataDirAccess(jc.DataDir); err != nil {
		return err
	}
	src := tokenSource{file: f.tokenFile, stdin: cmd.InOrStdin(), terminal: isTerminal(cmd.InOrStdin())}
	src.env, src.envSet = os.LookupEnv(TokenEnv)
	jc.Token = src.read
	jc.Claims = hwclaims.Read(os.Getenv(claimsRootEnv))

	res, err := agent.Join(cmd.Context(), jc)
	if err != nil {
		return err
	}
	id := res.State.Identity
	verb := "joined as"
	if res.Already {
		verb = "already joined as"
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s (site %s, role %s); certificate valid until %s\n",
		verb, id.NodeID, siteOrDash(id.Site), id.Role, res.State.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// checkDataDirAccess refuses early, with the way forward, when the data
// directory cannot be written by this user (the system directory needs
// root).
func checkDataDirAccess(dir string) error {
	probe := dir
	for {
		if _, err := os.Stat(probe); err == nil {
			break
		}
		parent := filepath.Dir(probe)
		if parent == probe {
			break
		}
		probe = parent
	}
	f, err := os.CreateTemp(probe, ".bcd-write-check-")
	if err != nil {
		if cli.IsRoot() {
			return fmt.Errorf("cannot write to %s: %w", probe, err)
		}
		return fmt.Errorf("cannot write the identity to %s (%v): run bcd join as root, or pass --data-dir with a folder you own", dir, err)
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	return nil
}

func siteOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
