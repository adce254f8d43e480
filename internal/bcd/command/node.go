package command

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
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
it. When the certificate expired (while the node was off, or while every
renewal failed, say on a full disk) it exits 1 too: an expired certificate
never renews. Either way the message ends with the way back for the node's
attestor: bcd join --reset --yes with a fresh token, or --attestor tpm.

It refuses a data directory or credentials folder other users may write or
another user owns, with the chmod or chown to run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := conn.resolve()
			if err != nil {
				return err
			}
			if err := checkDataDir(cfg.DataDir, cfg); err != nil {
				return err
			}
			if err := checkDataDirNamed(cfg.Layout().Credentials(), "the credentials folder", cfg); err != nil {
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
				fmt.Fprintln(cmd.ErrOrStderr(), "agent: join again: "+identity.WayBack(attestorOf(cfg)))
				return &cli.ExitError{Code: cli.ExitFailure}
			}
			return err
		},
	}
	conn.register(c.Flags())
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return c
}

// attestorOf is the attestor of the identity in cfg's data directory, else
// config.toml's [join] attestor.
func attestorOf(cfg *config.BCD) string {
	if id, _, _, _, err := identity.ReadIdentity(cfg.DataDir); err == nil && id.Attestor != "" {
		return id.Attestor
	}
	return cfg.Join.Attestor
}
