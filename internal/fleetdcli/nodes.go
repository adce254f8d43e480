package fleetdcli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
)

func nodesCommand() *cobra.Command {
	c := &cobra.Command{Use: "nodes", Aliases: []string{"node"}, Short: "List and show nodes"}
	c.AddCommand(nodesListCommand(), nodesShowCommand())
	return c
}

func nodesListCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "list",
		Short: "List the nodes the control plane knows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, done, err := f.dial()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := callCtx(cmd.Context())
			defer cancel()
			resp, err := client.ListNodes(ctx, &adminv1.ListNodesRequest{})
			if err != nil {
				return rpcError("list nodes", err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), append([]*adminv1.Node{}, resp.Nodes...))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tROLE\tSITE\tSTATE\tGEN\tHOSTNAME\tCERT EXPIRES")
			for _, n := range resp.Nodes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.Id, n.Role, orDash(n.Site), n.State, n.IdentityGeneration, orDash(n.Hostname), timeOrDash(n.CertNotAfterUnix))
			}
			return tw.Flush()
		},
	}
	f.register(c)
	return c
}

func nodesShowCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "show ID",
		Short: "Show one node",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, done, err := f.dial()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := callCtx(cmd.Context())
			defer cancel()
			resp, err := client.GetNode(ctx, &adminv1.GetNodeRequest{Id: args[0]})
			if err != nil {
				return rpcError("show node "+args[0], err)
			}
			n := resp.Node
			if f.json {
				return printJSON(cmd.OutOrStdout(), n)
			}
			w := cmd.OutOrStdout()
			for _, kv := range [][2]string{
				{"node", n.Id}, {"spiffe id", n.SpiffeId}, {"role", n.Role}, {"site", orDash(n.Site)},
				{"state", n.State}, {"generation", fmt.Sprint(n.IdentityGeneration)}, {"attestor", n.Attestor},
				{"hostname", orDash(n.Hostname)}, {"product uuid", orDash(n.ProductUuid)},
				{"serials", orDash(strings.Join(n.Serials, ", "))}, {"macs", orDash(strings.Join(n.Macs, ", "))},
				{"gpus", orDash(strings.Join(n.GpuUuids, ", "))}, {"daemon version", orDash(n.DaemonVersion)},
				{"joined", timeOrDash(n.JoinedUnix)}, {"last seen", timeOrDash(n.LastSeenUnix)},
				{"certificate", orDash(n.CertSerial)}, {"cert expires", timeOrDash(n.CertNotAfterUnix)},
			} {
				fmt.Fprintf(w, "%-15s %s\n", kv[0]+":", kv[1])
			}
			return nil
		},
	}
	f.register(c)
	return c
}
