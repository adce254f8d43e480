package bcdcli

import (
	"crypto/x509"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/agent"
	"github.com/nodetrust/nodetrust/doctor"
	"github.com/nodetrust/nodetrust/internal/cli"
)

func doctorCommand() *cobra.Command {
	var conn connFlags
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Check this machine's identity, config, clock and control plane, with the way back for each problem",
		Long: `doctor runs each check and prints pass, warn or fail, and for each warning or
failure what to do. Exit status: 0 when all pass, 3 for a warning, 1 for a failure.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var results []doctor.Result
			cfg, cfgErr := conn.resolve()
			cfgPath := conn.config
			if conn.server != "" {
				cfgPath = "the command line"
			}
			results = append(results, doctor.CheckConfig(cfgPath, cfgErr))

			dataDir := conn.dataDir
			if cfg != nil {
				dataDir = cfg.DataDir
			}
			if dataDir != "" {
				st, err := loadState(cmd.Context(), dataDir, cfgTPM(conn))
				var leaf *x509.Certificate
				if err == nil {
					leaf = st.Leaf
				}
				results = append(results, doctor.CheckIdentity(dataDir, err, leaf, timeNow()))
			}
			if cfg != nil {
				offset, err := agent.ClockOffset(cmd.Context(), cfg.Server, cfg.ServerName, cfg.Pins.ServingCA)
				results = append(results, doctor.CheckReachable(cfg.Server, err))
				if err == nil {
					results = append(results, doctor.CheckClock(offset, nil))
				}
			}
			doctor.Print(cmd.OutOrStdout(), results)
			if code := doctor.ExitCode(doctor.Worst(results)); code != 0 {
				return &cli.ExitError{Code: code}
			}
			return nil
		},
	}
	conn.register(c.Flags())
	return c
}
