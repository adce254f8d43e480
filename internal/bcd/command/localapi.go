package command

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/localapi"
)

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
