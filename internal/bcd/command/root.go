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

  bcd join < token.txt       join with a token from the control plane's operator
  bcd status                 show this machine's identity`,
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(joinCommand(), nodeCommand(), helperCommand(), statusCommand(), doctorCommand(), runCommand(), callCommand(), launchCommand())
	return root
}

// Execute runs bcd with args.
func Execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c := Command(stdin, stdout, stderr)
	c.SetArgs(args)
	return c.ExecuteContext(ctx)
}
