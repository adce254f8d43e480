package command

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/cli"
)

func tokenCommand() *cobra.Command {
	c := &cobra.Command{Use: "token", Short: "Create and list join tokens"}
	c.AddCommand(tokenCreateCommand(), tokenListCommand())
	return c
}

func tokenCreateCommand() *cobra.Command {
	var (
		f                      adminFlags
		role, site, nodeID     string
		ttl                    time.Duration
		allowReclaim, approval bool
	)
	c := &cobra.Command{
		Use:   "create --role R",
		Short: "Create a single-use join token and print it once",
		Long: `create prints a new join token on standard output, once; the server keeps only
its hash. Hand it to the machine on standard input or in a file, never on a
command line:  bcd join < token.txt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if role == "" {
				return cli.Usagef("token create needs --role")
			}
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.CreateToken(ctx, &adminv1.CreateTokenRequest{
				Role: role, Site: site, TtlSeconds: int64(ttl / time.Second), NodeId: nodeID, AllowReclaim: allowReclaim, RequireApproval: approval,
			})
			if err != nil {
				return rpcError("create token", err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"token": resp.Token, "id": resp.Info.Id, "expires": timeOrDash(resp.Info.ExpiresUnix)})
			}
			fmt.Fprintln(cmd.OutOrStdout(), resp.Token)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s for role %s expires %s; it is shown only once\n", resp.Info.Id, resp.Info.Role, timeOrDash(resp.Info.ExpiresUnix))
			return nil
		},
	}
	f.register(c)
	c.Flags().StringVar(&role, "role", "", "role of the node that joins with it (required)")
	c.Flags().StringVar(&site, "site", "", "site of the node")
	c.Flags().DurationVar(&ttl, "ttl", 0, "lifetime, e.g. 1h (default: the server's token_ttl)")
	c.Flags().StringVar(&nodeID, "node-id", "", "join only as this node id")
	c.Flags().BoolVar(&allowReclaim, "allow-reclaim", false, "may re-join a machine the control plane already knows")
	c.Flags().BoolVar(&approval, "require-approval", false, "a join with it waits for 'fleetd nodes approve ID'")
	return c
}

func tokenListCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "list",
		Short: "List join tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListTokens(ctx, &adminv1.ListTokensRequest{})
			if err != nil {
				return rpcError("list tokens", err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), append([]*adminv1.Token{}, resp.Tokens...))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tROLE\tSITE\tNODE\tRECLAIM\tEXPIRES\tUSED BY")
			for _, t := range resp.Tokens {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\t%s\t%s\n", t.Id, t.Role, orDash(t.Site), orDash(t.NodeId), t.AllowReclaim, timeOrDash(t.ExpiresUnix), orDash(t.UsedByNode))
			}
			return tw.Flush()
		},
	}
	f.register(c)
	return c
}
