package command

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/version"
)

// crashAfterEnv names a renewal storage step after which bcd node kills
// itself with SIGKILL: a development knob for crash-safety tests.
const crashAfterEnv = "NODETRUST_DEBUG_CRASH_AFTER"

// revokedLine is what bcd node prints when its certificate is revoked.
const revokedLine = "agent: this node's certificate was revoked"

func nodeCommand() *cobra.Command {
	var (
		conn     connFlags
		logLevel string
	)
	c := &cobra.Command{
		Use:   "node",
		Short: "Run the agent: keep a live session with the control plane and renew the identity",
		Long: `node loads the identity, keeps one live session with the control plane
(authenticated by the node certificate), and renews the certificate with a new
key at 60% of its lifetime. When the control plane revokes the certificate it
exits 1 with "agent: this node's certificate was revoked" and never redials with
it; join again with bcd join --reset --yes, then bcd join.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := conn.resolve()
			if err != nil {
				return err
			}
			err = bcd.RunNode(cmd.Context(), bcd.NodeOptions{
				Config:     cfg,
				Logger:     cli.NewLogger(cmd.ErrOrStderr(), logLevel),
				Version:    version.Version,
				ClaimsRoot: os.Getenv(claimsRootEnv),
				CrashAfter: os.Getenv(crashAfterEnv),
			})
			if errors.Is(err, agent.ErrRevoked) {
				fmt.Fprintln(cmd.ErrOrStderr(), revokedLine)
				return &cli.ExitError{Code: cli.ExitFailure}
			}
			return err
		},
	}
	conn.register(c.Flags())
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return c
}
