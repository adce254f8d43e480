package command

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/cli"
)

func nodesVerdictsCommand() *cobra.Command {
	var (
		f     adminFlags
		limit uint32
	)
	c := &cobra.Command{
		Use:   "verdicts ID",
		Short: "Show a node's boot-policy verdicts, newest first (owner, operator, auditor)",
		Long: `verdicts lists the boot-policy verdicts fleetd stored for a node: its tpm joins (intake),
attested renewals and boot checks, each with every rule that failed and why
(docs/boot-policy.md). fleetd keeps the last few per node; verdicts.jsonl in
data_dir keeps them whole.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListVerdicts(ctx, &adminv1.ListVerdictsRequest{NodeId: args[0], Limit: limit})
			if err != nil {
				return rpcError("verdicts of node "+args[0], err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), resp.Verdicts)
			}
			return printVerdicts(cmd, resp.Verdicts)
		},
	}
	f.register(c)
	c.Flags().Uint32Var(&limit, "limit", 20, "show at most this many")
	return c
}

func printVerdicts(cmd *cobra.Command, vs []*adminv1.Verdict) error {
	w := cmd.OutOrStdout()
	if len(vs) == 0 {
		fmt.Fprintln(w, "no verdicts")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tSTAGE\tCLASS\tRESULT\tFAILED RULES")
	for _, v := range vs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", time.Unix(0, v.TimeUnixNano).UTC().Format(time.RFC3339), v.Stage, v.Class, verdictResult(v), failedList(v))
	}
	return tw.Flush()
}

func verdictResult(v *adminv1.Verdict) string {
	if v.Passed {
		return "pass"
	}
	return "fail"
}

func failedList(v *adminv1.Verdict) string {
	if len(v.Failed) == 0 {
		return "-"
	}
	parts := make([]string, len(v.Failed))
	for i, r := range v.Failed {
		parts[i] = r.Rule + ": " + r.Reason
	}
	return strings.Join(parts, "; ")
}

func nodesCheckCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "check ID",
		Short: "Ask a node's live session for boot evidence now and show the verdict (owner, operator)",
		Long: `check asks the node's live session, on the server that holds it, for a quote over a fresh
nonce and its event log, as the hourly boot check does, and prints the verdict and what fleetd
did: a failed worker is quarantined (a cordon requested of the actuator), a failed control-plane
class only alerts (docs/boot-policy.md). A node without a live session there, or one that does
not answer in time, gives no evidence: nothing changes. Exit status: 0 when the verdict passes,
1 when it fails or there is none.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.CheckNode(ctx, &adminv1.CheckNodeRequest{NodeId: args[0]})
			if err != nil {
				return rpcError("boot check of node "+args[0], err)
			}
			if f.json {
				if err := printJSON(cmd.OutOrStdout(), resp); err != nil {
					return err
				}
			} else {
				v := resp.Verdict
				fmt.Fprintf(cmd.OutOrStdout(), "node %s: boot %s (class %s, %s); action: %s\n", args[0], verdictResult(v), v.Class, v.Stage, resp.Action)
				for _, r := range v.Failed {
					fmt.Fprintf(cmd.OutOrStdout(), "  FAIL %s: %s\n", r.Rule, r.Reason)
				}
			}
			if !resp.Verdict.Passed {
				return &cli.ExitError{Code: cli.ExitFailure}
			}
			return nil
		},
	}
	f.register(c)
	return c
}
