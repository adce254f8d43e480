package command

import (
	"os"

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
		Long:  "Serve the control plane.\n\nWithout GOGC in its environment, fleetd serve runs Go's garbage collector\nat GOGC=50 (less memory per held session, about 10% more CPU per renewal);\nset GOGC to choose otherwise.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.LoadFleetd(path)
			if err != nil {
				return err
			}
			log := cli.NewLogger(cmd.ErrOrStderr(), cfg.LogLevel)
			gogc, set := applyServeGC(os.Getenv)
			log.InfoContext(cmd.Context(), "garbage collection target", "gogc", gogc, "from_environment", !set)
			return fleetd.Run(cmd.Context(), fleetd.Options{Config: cfg, Logger: log})
		},
	}
	c.Flags().StringVar(&path, "config", "fleetd.toml", "path of fleetd.toml")
	return c
}
