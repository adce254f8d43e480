package command

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/cli"
)

func nodesCommand() *cobra.Command {
	c := &cobra.Command{Use: "nodes", Aliases: []string{"node"}, Short: "List and show nodes, and change their lifecycle state"}
	c.AddCommand(nodesListCommand(), nodesShowCommand(), nodesRevokeCommand(), nodesDeleteCommand(), nodesApproveCommand(), nodesPendingCommand(), nodesHistoryCommand(), nodesVerdictsCommand(), nodesCertsCommand(), nodesCheckCommand())
	c.AddCommand(transitionCommands()...)
	return c
}

func nodesListCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "list",
		Short: "List the nodes the control plane knows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListNodes(ctx, &adminv1.ListNodesRequest{})
			if err != nil {
				return rpcError("list nodes", err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), append([]*adminv1.Node{}, resp.Nodes...))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tCLASS\tROLE\tSITE\tSTATE\tGEN\tHOSTNAME\tCERT EXPIRES")
			for _, n := range resp.Nodes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.Id, orDash(n.Class), n.Role, orDash(n.Site), n.State, n.IdentityGeneration, orDash(n.Hostname), timeOrDash(n.CertNotAfterUnix))
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
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
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
				{"node", n.Id}, {"spiffe id", n.SpiffeId}, {"class", orDash(n.Class)}, {"role", n.Role}, {"site", orDash(n.Site)},
				{"state", n.State}, {"generation", fmt.Sprint(n.IdentityGeneration)}, {"attestor", n.Attestor},
				{"hostname", orDash(n.Hostname)}, {"product uuid", orDash(n.ProductUuid)},
				{"serials", orDash(strings.Join(n.Serials, ", "))}, {"macs", orDash(strings.Join(n.Macs, ", "))},
				{"gpus", orDash(strings.Join(n.GpuUuids, ", "))}, {"daemon version", orDash(n.DaemonVersion)},
				{"joined", timeOrDash(n.JoinedUnix)}, {"last seen", timeOrDash(n.LastSeenUnix)},
				{"certificate", orDash(n.CertSerial)}, {"cert expires", timeOrDash(n.CertNotAfterUnix)}, {"ek pin", orDash(n.EkPin)},
			} {
				fmt.Fprintf(w, "%-15s %s\n", kv[0]+":", kv[1])
			}
			return nil
		},
	}
	f.register(c)
	return c
}

func nodesRevokeCommand() *cobra.Command {
	var (
		f      adminFlags
		reason string
	)
	c := &cobra.Command{
		Use:   "revoke ID --reason R",
		Short: "Revoke a node's certificates and end its live session",
		Long: `revoke raises the node's identity generation and revokes its certificates; its
live session gets a RevocationNotice and bcd node exits. The machine comes back
only with fresh evidence, after bcd join --reset --yes: a token made with
--allow-reclaim on standard input (a node without a proven EK), or bcd join
--attestor tpm for a machine that joined with its TPM (the same EK, a fresh
attestation). A quarantined or retired node stays so.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if reason == "" {
				return cli.Usagef("nodes revoke needs --reason")
			}
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.RevokeNode(ctx, &adminv1.RevokeNodeRequest{Id: args[0], Reason: reason})
			if err != nil {
				return rpcError("revoke node "+args[0], err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked node %s: %d certificates, identity generation now %d, live session notified: %t\n",
				args[0], len(resp.RevokedSerials), resp.IdentityGeneration, resp.SessionNotified)
			return nil
		},
	}
	f.register(c)
	c.Flags().StringVar(&reason, "reason", "", "why (recorded and sent to the node)")
	return c
}

func nodesDeleteCommand() *cobra.Command {
	var (
		f      adminFlags
		reason string
	)
	c := &cobra.Command{
		Use:   "delete ID",
		Short: "Revoke a node and remove it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.DeleteNode(ctx, &adminv1.DeleteNodeRequest{Id: args[0], Reason: reason})
			if err != nil {
				return rpcError("delete node "+args[0], err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted node %s: %d certificates revoked, live session notified: %t\n", args[0], len(resp.RevokedSerials), resp.SessionNotified)
			return nil
		},
	}
	f.register(c)
	c.Flags().StringVar(&reason, "reason", "", "why (default \"node deleted\")")
	return c
}

func nodesApproveCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "approve ID",
		Short: "Approve the pending join of a node (a token made with --require-approval)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ApproveNode(ctx, &adminv1.ApproveNodeRequest{Id: args[0]})
			if err != nil {
				return rpcError("approve node "+args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "approved %d pending join(s) of node %s; it completes at its next poll\n", resp.Approved, args[0])
			return nil
		},
	}
	f.register(c)
	return c
}

func nodesPendingCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "pending",
		Short: "List joins waiting for approval",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListPending(ctx, &adminv1.ListPendingRequest{})
			if err != nil {
				return rpcError("list pending joins", err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), append([]*adminv1.PendingJoin{}, resp.Pending...))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tROLE\tSITE\tHOSTNAME\tTOKEN\tAPPROVED\tEXPIRES")
			for _, p := range resp.Pending {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%t\t%s\n", p.NodeId, p.Role, orDash(p.Site), orDash(p.Hostname), p.TokenId, p.Approved, timeOrDash(p.ExpiresUnix))
			}
			return tw.Flush()
		},
	}
	f.register(c)
	return c
}
