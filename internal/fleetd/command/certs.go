package command

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
)

func nodesCertsCommand() *cobra.Command {
	var (
		f     adminFlags
		limit uint32
	)
	c := &cobra.Command{
		Use:   "certs ID",
		Short: "Show the certificates issued to a node, newest first (owner, operator, auditor)",
		Long: `certs lists the certificates fleetd issued to a node, of every identity generation,
revoked or not, newest first: serial, generation, kind (join or renew), when issued,
when it expires and whether it was revoked and why.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListCerts(ctx, &adminv1.ListCertsRequest{NodeId: args[0], Limit: limit})
			if err != nil {
				return rpcError("certificates of node "+args[0], err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), resp.Certs)
			}
			return printCerts(cmd, resp.Certs)
		},
	}
	f.register(c)
	c.Flags().Uint32Var(&limit, "limit", 20, "show at most this many (at most 1000)")
	return c
}

func printCerts(cmd *cobra.Command, cs []*adminv1.CertInfo) error {
	w := cmd.OutOrStdout()
	if len(cs) == 0 {
		fmt.Fprintln(w, "no certificates")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERIAL\tGENERATION\tKIND\tISSUED\tEXPIRES\tREVOKED")
	for _, c := range cs {
		revoked := "-"
		if c.RevokedUnix != 0 {
			revoked = timeOrDash(c.RevokedUnix) + " " + c.RevokedReason
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", c.Serial, c.Generation, c.Kind, timeOrDash(c.IssuedUnix), timeOrDash(c.NotAfterUnix), revoked)
	}
	return tw.Flush()
}
