package command

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/localapi"
)

func callCommand() *cobra.Command {
	var (
		api           apiFlags
		node, address string
		kind          string
	)
	c := &cobra.Command{
		Use:   "call SERVICE METHOD [JSON]",
		Short: "Make a signed call to bcd node as the command line, and print the reply",
		Long: `call signs a call with the command line's key (credentials/command_line.key
in the data directory) and sends it to the local API of bcd node. JSON is the
request (default {}; - reads it from standard input). The reply is printed as
JSON; a refusal ends with "rejected: <check>: …" and exit status 1.

  bcd call status get
  bcd call leases acquire '{"resource":"gpu0","ttl_seconds":120}'
  bcd call --kind cancel leases acquire '{"goal_id":"g-…"}'
  bcd call leases list
  bcd call membership list
  bcd call --node node-b status get     (relayed to node-b's daemon with this machine's proof)

docs/local-api.md lists the services and their requests.`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := []byte("{}")
			if len(args) == 3 {
				req = []byte(args[2])
				if args[2] == "-" {
					b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), callsig.MaxPayloadLen+1))
					if err != nil {
						return fmt.Errorf("read the request from standard input: %w", err)
					}
					req = b
				}
				if !json.Valid(req) {
					return cli.Usagef("the request is not JSON: %q; write it like '{\"resource\":\"gpu0\"}'", clipArg(string(req)))
				}
			}
			switch kind {
			case callsig.KindQuery, callsig.KindCancel:
			default:
				return cli.Usagef("--kind %q: want query or cancel", kind)
			}
			client, err := api.dialCLI(cmd.Context())
			if err != nil {
				return err
			}
			defer client.Close()
			var reply json.RawMessage
			err = client.Do(cmd.Context(), localapi.Call{Node: node, Address: address, Service: args[0], Method: args[1], Kind: kind, Request: req}, &reply)
			if err != nil {
				return err
			}
			var out bytes.Buffer
			if err := json.Indent(&out, reply, "", "  "); err != nil {
				out.Reset()
				out.Write(reply)
			}
			out.WriteByte('\n')
			_, err = cmd.OutOrStdout().Write(out.Bytes())
			return err
		},
	}
	api.register(c.Flags())
	c.Flags().StringVar(&node, "node", "", "the node id of the daemon to call (default: this machine's)")
	c.Flags().StringVar(&address, "address", "", "the federation address (host:port) of --node's daemon (default: from the active launch or [federation.peers])")
	c.Flags().StringVar(&kind, "kind", callsig.KindQuery, "the kind of call: query, or cancel to cancel a leases acquire goal")
	return c
}

func clipArg(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}
