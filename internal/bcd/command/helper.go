package command

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd"
	"github.com/nodetrust/nodetrust/internal/cli"
)

func helperCommand() *cobra.Command {
	var (
		conn     connFlags
		logLevel string
	)
	c := &cobra.Command{
		Use:   "helper",
		Short: "Run as root, own the TPM, and serve its operations to the [helper] user's bcd node",
		Long: `helper opens the TPM (the tpm setting) and serves tpm.nodekey, tpm.sign, tpm.ak,
tpm.certify, tpm.release (and the tpm join's tpm.ek, tpm.activate, tpm.quote) on
the [helper] socket, to the [helper] user and root only (peer credentials are
checked on each connection). Whoever can open the TPM device could clear it, so
the unprivileged bcd node never does; it checks every answer the helper gives.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := conn.resolve()
			if err != nil {
				return err
			}
			if !cfg.Helper.Enabled() {
				return cli.Usagef("bcd helper needs a [helper] section with user = \"…\" in %s", conn.config)
			}
			if !cli.IsRoot() {
				return errors.New("bcd helper runs as root: it owns the TPM")
			}
			return bcd.RunHelper(cmd.Context(), cfg, cli.NewLogger(cmd.ErrOrStderr(), logLevel))
		},
	}
	conn.register(c.Flags())
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return c
}
