package command

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/doctor"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/bcd/journal"
	"github.com/nodetrust/nodetrust/pki"
)

func statusCommand() *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
		last   int
	)
	c := &cobra.Command{
		Use:   "status",
		Short: "Show this machine's identity, its expiry, the next renewal and the journal",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, fraction := conn.dataDir, 0.0
			cfg, err := conn.resolve()
			if err == nil {
				dir, fraction = cfg.DataDir, cfg.Renewal.Fraction
			} else if dir == "" {
				return err
			}
			st, err := loadState(cmd.Context(), dir, cfg, conn)
			if err != nil {
				return err
			}
			jid, entries, jerr := journal.ReadLast(dir, last)
			id := st.Identity
			leaf := st.Leaf
			next := agent.RenewTime(leaf, fraction)
			w := cmd.OutOrStdout()
			if asJSON {
				type entry struct {
					Time   string `json:"time"`
					Kind   string `json:"kind"`
					Detail string `json:"detail"`
				}
				es := []entry{}
				for _, e := range entries {
					es = append(es, entry{e.Time.UTC().Format(time.RFC3339), e.Kind, e.Detail})
				}
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{
					"node_id": id.NodeID, "spiffe_id": id.SPIFFEID, "trust_domain": id.TrustDomain,
					"role": id.Role, "site": id.Site, "identity_generation": id.Generation,
					"attestor": id.Attestor, "key": id.KeyKind, "serial": pki.SerialHex(leaf),
					"not_before": leaf.NotBefore.UTC().Format(time.RFC3339), "not_after": leaf.NotAfter.UTC().Format(time.RFC3339),
					"next_renewal": next.UTC().Format(time.RFC3339), "data_dir": dir, "journal_id": jid, "journal": es,
				})
			}
			expired := ""
			if time.Now().After(leaf.NotAfter) {
				expired = " (EXPIRED: " + identity.WayBack(id.Attestor) + ")"
			}
			fmt.Fprintf(w, "node:          %s\n", id.NodeID)
			fmt.Fprintf(w, "spiffe id:     %s\n", id.SPIFFEID)
			fmt.Fprintf(w, "role:          %s\n", id.Role)
			fmt.Fprintf(w, "site:          %s\n", siteOrDash(id.Site))
			fmt.Fprintf(w, "generation:    %d\n", id.Generation)
			fmt.Fprintf(w, "key:           %s (%s)\n", id.KeyKind, datadir.Layout(dir).Key())
			fmt.Fprintf(w, "certificate:   %s\n", pki.SerialHex(leaf))
			fmt.Fprintf(w, "valid until:   %s%s\n", leaf.NotAfter.UTC().Format(time.RFC3339), expired)
			if rv := revocation(dir, id.NodeID); rv != nil {
				fmt.Fprintf(w, "REVOKED:       %s; join again: %s\n", doctor.RevokedMessage(id.NodeID, rv), identity.WayBack(id.Attestor))
			}
			fmt.Fprintf(w, "next renewal:  %s (while bcd node runs)\n", next.UTC().Format(time.RFC3339))
			switch {
			case jerr != nil:
				fmt.Fprintf(w, "journal:       unreadable (%v); bcd node starts a new one and keeps the identity\n", jerr)
			case jid == "":
				fmt.Fprintln(w, "journal:       none yet")
			default:
				fmt.Fprintf(w, "journal:       %s, last %d entries:\n", jid, len(entries))
				for _, e := range entries {
					fmt.Fprintf(w, "  %s  %-15s %s\n", e.Time.UTC().Format(time.RFC3339), e.Kind, e.Detail)
				}
			}
			return nil
		},
	}
	conn.register(c.Flags())
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().IntVar(&last, "last", 5, "how many journal entries to show")
	return c
}

// timeNow is the clock of the commands that judge expiry.
var timeNow = time.Now
