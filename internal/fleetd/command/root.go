package command

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/version"
)

// Command builds the fleetd command tree writing to stdout and stderr.
func Command(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "fleetd",
		Short: "nodetrust control plane: issues and keeps machine identities",
		Long: `fleetd is nodetrust's control plane. It issues short-lived node certificates
to machines that join with a token, and answers admin calls.

Start here:
  fleetd dev                         a complete control plane on loopback, for trying it out
  fleetd init --dir D --trust-domain T --server-name N
  fleetd serve --config fleetd.toml
  fleetd token create --role worker  a join token, printed once
  fleetd inventory apply nodes.yaml  declare machines (docs/inventory.md)
  fleetd render secrets --out FILE   a Talos cluster's secrets bundle for [render.CLASS] (docs/install.md)
  fleetd admin create --name N --role R  an admin credential (owner, declarer, operator, auditor)
  fleetd console                     the web console on loopback (prints a one-time login address)

  fleetd policy check --class C --log FILE --pcrs FILE
                                     test a boot policy on a captured boot`,
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(initCommand(), serveCommand(), devCommand(), tokenCommand(), nodesCommand(), adminCommand(), inventoryCommand(), claimsCommand(), policyCommand(), pkiCommand(), ekRootsCommand(), consoleCommand(), exportCommand(), renderCommand())
	return root
}

// Execute runs the command tree with args.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := Command(stdout, stderr)
	c.SetArgs(args)
	return c.ExecuteContext(ctx)
}
