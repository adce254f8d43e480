package command

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
)

func inventoryCommand() *cobra.Command {
	c := &cobra.Command{Use: "inventory", Short: "Plan, apply and read the declared inventory (docs/inventory.md)"}
	c.AddCommand(inventoryApplyCommand(true), inventoryApplyCommand(false), inventoryListCommand(), inventoryChangesCommand())
	return c
}

func inventoryApplyCommand(dryRun bool) *cobra.Command {
	var f adminFlags
	use, short, long := "apply FILE", "Apply an inventory file: declarer or owner only",
		`apply writes the changes plan prints, field by field, in one transaction; the
changelog records who wrote each field, when, and from which request. An invalid
file is refused whole with every error listed by line, and changes nothing.
Applying the same file twice changes nothing. An EK binding authorizes admission
only when a declarer credential wrote it.`
	if dryRun {
		use, short, long = "plan FILE", "Print the changes applying an inventory file would make",
			`plan reads the file, checks it as apply does, and prints what apply would add
and update, field by field, and what it would not do (a binding written by a
credential that is not a declarer, an entry of a retired node). It writes nothing.`
	}
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := readFile(args[0])
			if err != nil {
				return err
			}
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := sendInventory(ctx, client, data, dryRun)
			if err != nil {
				return rpcError(strings.Fields(use)[0]+" "+args[0], err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			printPlan(cmd.OutOrStdout(), resp)
			return nil
		},
	}
	f.register(c)
	return c
}

// sendInventory sends data in pieces of inventory.ChunkBytes (at least
// one, for an empty file) and returns the plan.
func sendInventory(ctx context.Context, client adminv1.AdminClient, data []byte, dryRun bool) (*adminv1.ApplyInventoryResponse, error) {
	stream, err := client.ApplyInventory(ctx)
	if err != nil {
		return nil, err
	}
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), inventory.ChunkBytes)
		if err := stream.Send(&adminv1.ApplyInventoryRequest{Chunk: data[:n], DryRun: dryRun}); err != nil {
			// The server's answer says why it stopped reading.
			if _, rerr := stream.CloseAndRecv(); rerr != nil {
				return nil, rerr
			}
			return nil, err
		}
		data = data[n:]
	}
	return stream.CloseAndRecv()
}

// readFile reads an inventory file ("-" is standard input), bounded.
func readFile(path string) ([]byte, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		fh, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		r = fh
	}
	data, err := io.ReadAll(io.LimitReader(r, inventory.MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > inventory.MaxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, inventory.MaxFileBytes)
	}
	return data, nil
}

func printPlan(w io.Writer, r *adminv1.ApplyInventoryResponse) {
	marks := map[string]string{inventory.KindAdd: "+", inventory.KindUpdate: "~", inventory.KindRetired: "!", inventory.KindMissing: "?"}
	for _, c := range r.Changes {
		fmt.Fprintf(w, "%s %s (%s)\n", marks[c.Kind], c.Device, c.Kind)
		for _, fd := range c.Fields {
			fmt.Fprintf(w, "    %s: %s -> %s\n", fd.Field, quoted(fd.Old), quoted(fd.New))
		}
		for _, warn := range c.Warnings {
			fmt.Fprintf(w, "    warning: %s\n", warn)
		}
	}
	verb := "Plan"
	if r.Applied {
		verb = "Applied (request " + r.RequestId + ")"
	}
	fmt.Fprintf(w, "%s: %d to add, %d to update, %d unchanged, %d retired (not written), %d not in the file (kept).\n",
		verb, r.Added, r.Updated, r.Unchanged, r.Retired, r.Missing)
}

func quoted(s string) string {
	if s == "" {
		return "(unset)"
	}
	return fmt.Sprintf("%q", s)
}

func inventoryListCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "list",
		Short: "List declared devices, their state, and whether their EK binding is honoured",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListDeclarations(ctx, &adminv1.ListDeclarationsRequest{})
			if err != nil {
				return rpcError("list the inventory", err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), append([]*adminv1.Declaration{}, resp.Declarations...))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tCLASS\tSITE\tSTATE\tSERIAL\tEK BINDING")
			for _, d := range resp.Declarations {
				binding := "-"
				if len(d.EkPins) > 0 {
					binding = "honoured: " + d.Binding
					if !d.BindingHonoured {
						binding = "NOT honoured: " + d.Binding
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, d.Class, orDash(d.Site), d.State, orDash(d.Serial), binding)
			}
			return tw.Flush()
		},
	}
	f.register(c)
	return c
}

func inventoryChangesCommand() *cobra.Command {
	var (
		f     adminFlags
		limit uint32
	)
	c := &cobra.Command{
		Use:   "changes [DEVICE]",
		Short: "Show the changelog: who wrote each field, when, from which request",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			device := ""
			if len(args) == 1 {
				device = args[0]
			}
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListChanges(ctx, &adminv1.ListChangesRequest{Device: device, Limit: limit})
			if err != nil {
				return rpcError("list changes", err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), append([]*adminv1.FieldChange{}, resp.Changes...))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tDEVICE\tFIELD\tOLD\tNEW\tWRITER\tROLE\tREQUEST")
			for _, ch := range resp.Changes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", timeOrDash(ch.TimeUnix), ch.Device, ch.Field, quoted(ch.Old), quoted(ch.New), ch.Actor, ch.ActorRole, ch.RequestId)
			}
			return tw.Flush()
		},
	}
	f.register(c)
	c.Flags().Uint32Var(&limit, "limit", 1000, "at most this many, newest first")
	return c
}

func claimsCommand() *cobra.Command {
	c := &cobra.Command{Use: "claims", Short: "Machines that asked to join and were not admitted"}
	var (
		f     adminFlags
		limit uint32
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List claims: what each machine claimed (capped), why it waits, first and last seen, how often",
		Long: `A claim authorizes nothing: it is a machine the inventory does not declare, a
planned device without an EK binding (or with one a declarer did not write), or a
machine whose EK its declaration does not name. Declare it (fleetd inventory
apply) and it joins at its next try.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListClaims(ctx, &adminv1.ListClaimsRequest{Limit: limit})
			if err != nil {
				return rpcError("list claims", err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), append([]*adminv1.Claim{}, resp.Claims...))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tATTESTOR\tHOSTNAME\tSERIALS\tDECLARED\tCOUNT\tFIRST SEEN\tLAST SEEN\tREASON")
			for _, cl := range resp.Claims {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", cl.Key, cl.Attestor, orDash(cl.Hostname), orDash(strings.Join(cl.Serials, ",")),
					orDash(cl.Declared), cl.Count, timeOrDash(cl.FirstSeenUnix), timeOrDash(cl.LastSeenUnix), cl.Reason)
			}
			return tw.Flush()
		},
	}
	f.register(list)
	list.Flags().Uint32Var(&limit, "limit", 1000, "at most this many, most recently seen first")
	c.AddCommand(list)
	return c
}
