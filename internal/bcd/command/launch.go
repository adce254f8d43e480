package command

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd/launch"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/localapi"
)

func launchCommand() *cobra.Command {
	var (
		api  apiFlags
		show bool
	)
	c := &cobra.Command{
		Use:   "launch FILE",
		Short: "Apply a launch: which instance runs on which machine, for calls between machines",
		Long: `launch reads a launch file (TOML) that places named instances on the machines
of a federation by node id, and hands it to bcd node on this machine. From
then on the daemon takes a call of an instance of another machine as that
instance only where the launch places it; the machines' addresses in the file
tell the daemon where to relay its own clients' calls. A new launch replaces
the previous one. Apply the same file on each machine.

  name = "demo"

  [machines.node-a]
  address = "10.0.0.1:7443"    # [federation] listen of node-a's bcd node

  [machines.node-b]
  address = "10.0.0.2:7443"

  [instances.trainer]
  node = "node-b"

--show prints the active launch instead.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if show == (len(args) == 1) {
				return cli.Usagef("give a launch FILE, or --show")
			}
			var l *launch.Launch
			if !show {
				data, err := os.ReadFile(args[0])
				if err != nil {
					return fmt.Errorf("read the launch file: %w", err)
				}
				if l, err = launch.Parse(data); err != nil {
					return fmt.Errorf("%s: %w", args[0], err)
				}
			}
			client, err := api.dialCLI(cmd.Context())
			if err != nil {
				return err
			}
			defer client.Close()
			w := cmd.OutOrStdout()
			if show {
				var active json.RawMessage
				if err := client.Call(cmd.Context(), localapi.ServiceLaunch, localapi.MethodGet, nil, &active); err != nil {
					return err
				}
				_, err := fmt.Fprintf(w, "%s\n", active)
				return err
			}
			if err := client.Call(cmd.Context(), localapi.ServiceLaunch, localapi.MethodApply, l, nil); err != nil {
				return err
			}
			here := l.Placed(client.NodeID())
			fmt.Fprintf(w, "launch %q applied on %s: %d machines, %d instances\n", l.Name, client.NodeID(), len(l.Machines), len(l.Instances))
			if len(here) > 0 {
				fmt.Fprintf(w, "instances placed on this machine (start each with bcd run --name NAME -- …): %s\n", strings.Join(here, ", "))
			}
			return nil
		},
	}
	api.register(c.Flags())
	c.Flags().BoolVar(&show, "show", false, "print the active launch")
	return c
}
