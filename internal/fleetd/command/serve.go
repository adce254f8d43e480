package command

import (
	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
)

func serveCommand() *cobra.Command {
	var path string
	c := &cobra.Command{
		Use:   "serve --config fleetd.toml",
		Short: "Serve the control plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.LoadFleetd(path)
			if err != nil {
				return err
			}
			log := cli.NewLogger(cmd.ErrOrStderr(), cfg.LogLevel)
			return fleetd.Run(cmd.Context(), fleetd.Options{Config: cfg, Logger: log})
		},
	}
	c.Flags().StringVar(&path, "config", "fleetd.toml", "path of fleetd.toml")
	return c
}
