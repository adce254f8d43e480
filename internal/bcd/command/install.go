package command

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/netreport"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/version"
)

func installCommand() *cobra.Command {
	var conn connFlags
	var lldpFile, iface, codeFile, marker string
	c := &cobra.Command{
		Use:   "install",
		Short: "Ask for this machine's installation after its intake and unwrap its install code",
		Long: `install runs in the install environment after bcd intake (docs/install.md,
"Admission"). It reads the switch port this machine is cabled to over LLDP
(lldpctl -f json, or --lldp-file holding that output: a file's report is
observed at the file's modification time), signs that network report and a
confirmation naming the intake session with the TPM's device key
(<data_dir>/devid/devid.keyrec), and asks the control plane to install the
machine. The control plane checks the declaration, the report against the
declared expected_port and the provision's authority, renders the machine's
config and answers with an install code wrapped to this TPM.

The code is unwrapped with the intake's AK (TPM2_ActivateCredential) and written
to --code-file (mode 0600; default /run/nodetrust/install-code, where the
provision script reads it); it is never printed. When the control plane's verdict
of the intake's boot was a pass, the boot pass marker is written too
(--pass-marker). The config is then fetched once with the code:
GET https://<fleetd>/v1/config/<product uuid> with Authorization: Bearer <code>.

A refusal prints the control plane's "Install refused" with what to do; the rule
is in fleetd's log. It needs the TPM of the intake (--tpm or tpm of
config.toml).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := conn.resolve()
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			warn := func(msg string) { fmt.Fprintln(stderr, "bcd: warning: "+msg) }
			observed := time.Now()
			if lldpFile != "" {
				st, err := os.Stat(lldpFile)
				if err != nil {
					return fmt.Errorf("--lldp-file: %w", err)
				}
				observed = st.ModTime()
			}
			rep, err := netreport.Build(cmd.Context(), netreport.Reader{File: lldpFile}, iface, observed)
			if err != nil {
				return fmt.Errorf("the network report: %w", err)
			}
			t, closeTPM, err := bcd.OpenTPM(cfg.TPM, cfg.HelperSocket(), true, warn)
			if err != nil {
				return err
			}
			defer closeTPM()
			if t == nil {
				return cli.Usagef("install needs the TPM of the intake: pass --tpm (a device path or tcp://host:port) or set tpm in config.toml")
			}
			res, err := agent.Install(cmd.Context(), agent.InstallConfig{
				Servers: cfg.Addresses(), ServerName: cfg.ServerName, Pins: cfg.Pins, DataDir: cfg.DataDir, TPM: t,
				Report: rep, CodeFile: codeFile, PassMarker: marker, Version: version.Version,
			})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "install admitted as %s; install code in %s (fetch the config of %s before %s)\n",
				res.Device, res.CodeFile, res.ProductUUID, res.ExpiresAt.Format(time.RFC3339))
			switch {
			case res.PassMarker != "":
				fmt.Fprintf(out, "boot pass marker in %s\n", res.PassMarker)
			case res.Rebooted:
				fmt.Fprintf(out, "no boot pass marker: the machine has rebooted since its intake, and fleetd judged only that boot; run bcd intake and bcd install again in this boot, or the provision script will not wipe the disk\n")
			default:
				fmt.Fprintf(out, "no boot pass marker: fleetd's verdict of the intake's boot is %q, not a pass; the provision script will not wipe the disk\n", res.BootVerdict)
			}
			return nil
		},
	}
	conn.register(c.Flags())
	f := c.Flags()
	f.StringVar(&lldpFile, "lldp-file", "", "read the LLDP neighbours from this file (lldpctl -f json's output) instead of running lldpctl")
	f.StringVar(&iface, "interface", "", "the uplink interface, when several interfaces heard a neighbour")
	f.StringVar(&codeFile, "code-file", agent.DefaultCodeFile, "where to write the install code (mode 0600)")
	f.StringVar(&marker, "pass-marker", "/run/nodetrust/boot-pass", "where to write the boot pass marker")
	return c
}
