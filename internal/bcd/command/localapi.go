package command

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/pflag"

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/bcd/localserver"
	"github.com/nodetrust/nodetrust/internal/bcd/tpmhelper"
	"github.com/nodetrust/nodetrust/internal/version"
	"github.com/nodetrust/nodetrust/localapi"
)

// runWithLocalAPI runs the local API and federation listener (package
// daemon) alongside run, the agent, until either ends. A local API that
// cannot start stops bcd node with its error.
func runWithLocalAPI(ctx context.Context, cfg *config.BCD, t tpmhelper.TPM, log *slog.Logger, run func(context.Context) error) error {
	// The agent loads the identity again; nothing else runs yet, so this
	// load's repairs (rule 2 of LoadState) cannot race with a renewal.
	st, err := identity.LoadState(cfg.DataDir, identity.LoadOptions{KeyLoader: agent.Keys{TPM: t}.Loader(ctx)})
	if err != nil {
		return err
	}
	resources := cfg.Leases.Resources
	if resources == nil {
		for i := range hwclaims.Read(os.Getenv(claimsRootEnv)).GPUUUIDs {
			resources = append(resources, fmt.Sprintf("gpu%d", i))
		}
	}
	d, err := localserver.New(localserver.Config{
		State:            st,
		DataDir:          cfg.DataDir,
		Socket:           cfg.SocketPath(),
		Namespace:        cfg.LocalAPI.Namespace,
		FederationListen: cfg.Federation.Listen,
		Peers:            cfg.Federation.Peers,
		Resources:        resources,
		LoadKey:          agent.Keys{TPM: t}.Loader(ctx),
		Version:          version.Version,
		Logger:           log,
	})
	if err != nil {
		return fmt.Errorf("start the local API: %w", err)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	derr := make(chan error, 1)
	go func() {
		derr <- d.Run(ctx)
		stop()
	}()
	err = run(ctx)
	stop()
	if e := <-derr; e != nil && err == nil {
		err = e
	}
	return err
}

// apiFlags say where the local API is: config.toml (or --data-dir) and an
// optional --socket.
type apiFlags struct {
	config, dataDir, socket string
}

func (f *apiFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.config, "config", config.DefaultBCDConfig, "path of config.toml")
	fl.StringVar(&f.dataDir, "data-dir", "", "the data directory of bcd node (default: data_dir of config.toml, else "+config.DefaultBCDDataDir+")")
	fl.StringVar(&f.socket, "socket", "", "the local API's socket (default: [local_api] socket of config.toml, else <data-dir>/run/bcd.sock)")
}

// paths returns the socket and the command line's key file.
func (f *apiFlags) paths() (socket, keyFile string, err error) {
	cfg, err := config.LoadBCD(f.config)
	switch {
	case err == nil:
	case f.dataDir != "" || f.socket != "":
		// No usable config.toml: the flags say where things are.
		cfg = &config.BCD{}
	default:
		return "", "", fmt.Errorf("%w; or pass --data-dir (and --socket when bcd node listens elsewhere)", err)
	}
	if f.dataDir != "" {
		cfg.DataDir = f.dataDir
	}
	if f.socket != "" {
		cfg.LocalAPI.Socket = f.socket
	}
	return cfg.SocketPath(), cfg.Layout().CLIKey(), nil
}

// dialCLI connects to the local API and signs as the command line.
func (f *apiFlags) dialCLI(ctx context.Context) (*localapi.Client, error) {
	socket, keyFile, err := f.paths()
	if err != nil {
		return nil, err
	}
	key, err := localapi.ReadKeyFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w (bcd node makes it at its first start)", err)
	}
	signer, err := callsig.NewSigner(callsig.SignerConfig{Sender: localapi.CLISender, Key: key})
	if err != nil {
		return nil, err
	}
	return localapi.Dial(ctx, socket, signer)
}
