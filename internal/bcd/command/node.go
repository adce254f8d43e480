package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/journal"
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
			log := cli.NewLogger(cmd.ErrOrStderr(), logLevel)
			t, closeTPM, err := agent.OpenTPM(cfg.TPM, helperSocket(cfg), false, func(msg string) { log.Warn(msg) })
			if err != nil {
				return err
			}
			defer closeTPM()
			j, err := journal.Open(cfg.DataDir, time.Now)
			if err != nil {
				return fmt.Errorf("open the journal: %w", err)
			}
			defer j.Close()
			if j.Recovered() {
				log.Warn("the journal was unreadable and starts over; the identity is kept", "journal_id", j.ID())
			}
			nc := agent.NodeConfig{
				Server:        cfg.Server,
				ServerName:    cfg.ServerName,
				Pins:          cfg.Pins,
				DataDir:       cfg.DataDir,
				Version:       version.Version,
				Logger:        log,
				Journal:       j,
				TPM:           t,
				RenewFraction: cfg.Renewal.Fraction,
				BackoffMin:    cfg.Renewal.BackoffMin.Duration,
				BackoffMax:    cfg.Renewal.BackoffMax.Duration,
			}
			if step := os.Getenv(crashAfterEnv); step != "" {
				nc.AfterStore = func(s string) {
					if s == step {
						_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
						select {}
					}
				}
			}
			// The local API and federation listener run alongside the agent.
			err = runWithLocalAPI(cmd.Context(), cfg, t, log, func(ctx context.Context) error { return agent.RunNode(ctx, nc) })
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
