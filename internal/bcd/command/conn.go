package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/nodetrust/nodetrust/internal/bcd"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/cli"
)

// connFlags say where the control plane is and how to trust it: a
// config.toml, or --server with the three pins (a machine bootstrapped
// without config.toml).
type connFlags struct {
	config, server, serverName, dataDir string
	servingPin, signingPin, encPin      string
	tpm                                 string
}

func (f *connFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.config, "config", config.DefaultBCDConfig, "path of config.toml")
	fl.StringVar(&f.server, "server", "", "control plane host:port (several, comma-separated, for replicas), to run without config.toml (with the three pin flags)")
	fl.StringVar(&f.serverName, "server-name", "", "name checked in the serving certificate (default: the host of --server)")
	fl.StringVar(&f.dataDir, "data-dir", "", "where the identity lives (default: data_dir of config.toml, else "+config.DefaultBCDDataDir+")")
	fl.StringVar(&f.servingPin, "serving-ca-spki-pin", "", "pin of the serving CA (with --server)")
	fl.StringVar(&f.signingPin, "join-signing-key-pin", "", "pin of the JoinService signing key (with --server)")
	fl.StringVar(&f.encPin, "join-encryption-key-pin", "", "pin of the join encryption key (with --server)")
	fl.StringVar(&f.tpm, "tpm", "", "TPM: auto, off, a device path or tcp://host:port (default: tpm of config.toml, else auto)")
}

// resolve returns the node's configuration from the flags: config.toml
// when --server is absent, else a configuration made of the flags.
func (f *connFlags) resolve() (*config.BCD, error) {
	if f.server != "" {
		addrs := strings.Split(f.server, ",")
		b := &config.BCD{Server: addrs[0], Servers: addrs[1:], ServerName: f.serverName, DataDir: f.dataDir,
			ServingCASPKIPin: f.servingPin, JoinSigningKeyPin: f.signingPin, JoinEncryptionKeyPin: f.encPin}
		pins, err := config.ParsePins(
			config.NamedPin{Name: "--serving-ca-spki-pin", Value: f.servingPin},
			config.NamedPin{Name: "--join-signing-key-pin", Value: f.signingPin},
			config.NamedPin{Name: "--join-encryption-key-pin", Value: f.encPin},
		)
		if err != nil {
			return nil, cli.Usagef("%v", err)
		}
		if err := b.Validate(); err != nil {
			return nil, cli.Usagef("--server: %v", err)
		}
		b.Pins = pins
		if b.DataDir == "" {
			b.DataDir = config.DefaultBCDDataDir
		}
		b.TPM = "auto"
		if f.tpm != "" {
			b.TPM = f.tpm
		}
		return b, nil
	}
	cfg, err := config.LoadBCD(f.config)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no config at %s; run the install script, or pass --server with the three pin flags and --data-dir: %w", f.config, os.ErrNotExist)
	}
	if err != nil {
		return nil, err
	}
	if f.dataDir != "" {
		cfg.DataDir = f.dataDir
	}
	if f.tpm != "" {
		cfg.TPM = f.tpm
	}
	return cfg, nil
}

// dataDirOnly returns the data directory without needing pins: --data-dir,
// else data_dir of config.toml (which must load), else the default for a
// machine bootstrapped with --server.
func (f *connFlags) dataDirOnly() (string, error) {
	if f.dataDir != "" {
		return f.dataDir, nil
	}
	if f.server != "" {
		return config.DefaultBCDDataDir, nil
	}
	cfg, err := config.LoadBCD(f.config)
	if err != nil {
		return "", fmt.Errorf("%w; or pass --data-dir to look at a data directory without a config", err)
	}
	return cfg.DataDir, nil
}

// loadState loads the identity with this host's key loader: a TPM-held
// node key is derived in the TPM cfg names (or through bcd helper under
// [helper]); without a config, in the one --tpm names, else "auto".
func loadState(ctx context.Context, dir string, cfg *config.BCD, f connFlags) (*identity.State, error) {
	spec, socket := "auto", ""
	if cfg != nil {
		spec, socket = cfg.TPM, cfg.HelperSocket()
	} else if f.tpm != "" {
		spec = f.tpm
	}
	t, closeTPM, err := bcd.OpenTPM(spec, socket, false, nil)
	if err != nil {
		return nil, err
	}
	defer closeTPM()
	attestor := ""
	if cfg != nil {
		attestor = cfg.Join.Attestor
	}
	return identity.LoadState(dir, identity.LoadOptions{KeyLoader: agent.Keys{TPM: t}.Loader(ctx), Attestor: attestor})
}
