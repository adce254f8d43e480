package command

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/version"
)

// Command builds the bcd command tree.
func Command(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "bcd",
		Short: "nodetrust node: joins the control plane and holds this machine's identity",
		Long: `bcd gives this machine an identity from a nodetrust control plane and keeps it.

The identity:
  bcd join < token.txt       join with a token (or --attestor tpm: the TPM's EK)
  bcd node                   keep a live session and renew; serve the local API
  bcd helper                 as root: own the TPM for an unprivileged bcd node
  bcd status                 show this machine's identity and its journal
  bcd doctor                 check everything, with the way back for each problem

Installation (in the install environment, docs/install.md):
  bcd intake                 prove the TPM and the boot; get the device certificates
  bcd install                ask for installation; unwrap the install code

Signed calls (bcd node must run):
  bcd run -- CMD             start an instance with a key of its own
  bcd call SERVICE METHOD    call the daemon as the command line
  bcd launch                 place instances on machines`,
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(joinCommand(), intakeCommand(), installCommand(), nodeCommand(), helperCommand(), statusCommand(), doctorCommand(), runCommand(), callCommand(), launchCommand())
	return root
}

// Execute runs bcd with args.
func Execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c := Command(stdin, stdout, stderr)
	c.SetArgs(args)
	return c.ExecuteContext(ctx)
}
