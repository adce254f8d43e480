package command

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/version"
	"github.com/nodetrust/nodetrust/pki"
)

func intakeCommand() *cobra.Command {
	var conn connFlags
	c := &cobra.Command{
		Use:   "intake",
		Short: "Prove this machine's TPM and boot in the install environment and get its device certificates",
		Long: `intake runs in the install environment (docs/install.md, "Intake"). It makes a
device key and an attestation key (AK) in the TPM, has the AK certify the device
key, and proves to the control plane that both sit in the TPM of the EK its
declaration binds (credential activation) and how the machine booted (a quote of
PCRs 0-7 over the control plane's nonce, with the event log). The control plane
judges the boot by the install environment class's policy and issues two
certificates under its DevID CA: the LDevID for the device key and the LAK
certificate for the AK.

It stores them, the two keys' TPM records (the private keys never leave the TPM)
and the intake session in <data_dir>/devid (0700; files 0600) and prints the
device, the session and when both end. It needs a TPM (--tpm or tpm of
config.toml) and no token: the declaration's EK binding admits the machine.

A refusal prints the control plane's "Intake refused" with what to do; the reason
is in fleetd's log. Without a config file, --server, the three pin flags and
--data-dir say where the control plane is.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := conn.resolve()
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			warn := func(msg string) { fmt.Fprintln(stderr, "bcd: warning: "+msg) }
			if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
				return fmt.Errorf("create the data directory: %w", err)
			}
			if err := checkDataDir(cfg.DataDir, cfg); err != nil {
				return err
			}
			t, closeTPM, err := bcd.OpenTPM(cfg.TPM, cfg.HelperSocket(), true, warn)
			if err != nil {
				return err
			}
			defer closeTPM()
			if t == nil {
				return cli.Usagef("intake needs a TPM: pass --tpm (a device path or tcp://host:port) or set tpm in config.toml")
			}
			ic := agent.IntakeConfig{
				Servers: cfg.Addresses(), ServerName: cfg.ServerName, Pins: cfg.Pins, DataDir: cfg.DataDir,
				TPM: t, Claims: hwclaims.Read(os.Getenv(claimsRootEnv)), Version: version.Version,
			}
			if cfg.BootCheck.EventLog != "" || !strings.HasPrefix(cfg.TPM, "tcp://") {
				if ic.EventLog, err = readEventLog(eventLogOf(cfg)); err != nil {
					return err
				}
			}
			res, err := agent.Intake(cmd.Context(), ic)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "intake passed as %s; session %s until %s\n", res.Session.Device, res.Session.ID, res.Session.NotAfter.Format(time.RFC3339))
			fmt.Fprintf(out, "LDevID serial %s, LAK certificate serial %s, both until %s, in %s\n",
				pki.SerialHex(res.LDevID[0]), pki.SerialHex(res.LAK[0]), res.LDevID[0].NotAfter.UTC().Format(time.RFC3339), res.Dir)
			return nil
		},
	}
	conn.register(c.Flags())
	return c
}
