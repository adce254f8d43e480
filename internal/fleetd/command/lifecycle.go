package command

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/cli"
)

// transitionCommands are fleetd nodes provision|quarantine|release|retire.
func transitionCommands() []*cobra.Command {
	var out []*cobra.Command
	for _, t := range []struct{ action, short, long string }{
		{"provision", "Authorize a planned device's first installation (owner, operator)",
			"provision moves a declared device from planned to provisioning: its join is then taken\n(a TPM join still needs the EK binding a declarer wrote)."},
		{"quarantine", "Quarantine a node: no renewal, no re-join, until release (owner, operator)",
			"quarantine keeps the node's certificate and live session, but refuses its renewals and\nany re-join by token or TPM until fleetd nodes release."},
		{"release", "Lift a quarantine: the node is active and renews again (owner only)",
			"release lifts a quarantine, an operator's or the boot policy's (docs/boot-policy.md): the node\nis active and renews again. The reason is recorded in its history and the audit trail."},
		{"retire", "Retire a node for good (owner only)",
			"retire revokes the node's certificates and ends its live session; it never renews or\nre-joins again. Its unused join tokens and pending joins are deleted, and it leaves the\nSPIRE export as retired: its fleet-owned entries go and its agents are banned (at once when\n[export.spire] names a socket, within the safeguards; see docs/spire.md). The machine comes\nback only declared again under a new name."},
	} {
		var (
			f      adminFlags
			reason string
		)
		action := t.action
		c := &cobra.Command{
			Use:   action + " ID --reason R",
			Short: t.short,
			Long:  t.long,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if reason == "" {
					return cli.Usagef("nodes %s needs --reason", action)
				}
				client, ctx, done, err := f.open(cmd)
				if err != nil {
					return err
				}
				defer done()
				resp, err := client.TransitionNode(ctx, &adminv1.TransitionNodeRequest{Id: args[0], Action: action, Reason: reason})
				if err != nil {
					return rpcError(action+" node "+args[0], err)
				}
				if f.json {
					return printJSON(cmd.OutOrStdout(), resp)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s is %s", args[0], resp.Node.State)
				if len(resp.RevokedSerials) > 0 || resp.SessionNotified {
					fmt.Fprintf(cmd.OutOrStdout(), ": %d certificates revoked, live session notified: %t", len(resp.RevokedSerials), resp.SessionNotified)
				}
				fmt.Fprintln(cmd.OutOrStdout())
				for _, w := range resp.Warnings {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
				}
				return nil
			},
		}
		f.register(c)
		c.Flags().StringVar(&reason, "reason", "", "why (recorded in the node's history and the audit trail)")
		out = append(out, c)
	}
	return out
}

func nodesHistoryCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "history ID",
		Short: "Show a node's lifecycle history: who changed its state, when, why, from which state",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.NodeHistory(ctx, &adminv1.NodeHistoryRequest{Id: args[0]})
			if err != nil {
				return rpcError("history of node "+args[0], err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "node %s is %s\n", args[0], resp.State)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tFROM\tTO\tBY\tREASON")
			for _, h := range resp.Changes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", timeOrDash(h.TimeUnix), orDash(h.From), h.To, h.Actor, h.Reason)
			}
			return tw.Flush()
		},
	}
	f.register(c)
	return c
}
