package command

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
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
