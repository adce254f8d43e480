package bcdcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/config"
	"github.com/nodetrust/nodetrust/identity"
)

func statusCommand() *cobra.Command {
	var cfgPath, dataDir string
	var asJSON bool
	c := &cobra.Command{
		Use:   "status",
		Short: "Show this machine's identity",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := dataDir
			if dir == "" {
				cfg, err := config.LoadBCD(cfgPath)
				switch {
				case err == nil:
					dir = cfg.DataDir
				case errors.Is(err, os.ErrNotExist):
					dir = config.DefaultBCDDataDir
				default:
					return err
				}
			}
			st, err := identity.LoadState(dir, identity.LoadOptions{})
			if err != nil {
				return err
			}
			id := st.Identity
			out := map[string]any{
				"node_id":             id.NodeID,
				"spiffe_id":           id.SPIFFEID,
				"trust_domain":        id.TrustDomain,
				"role":                id.Role,
				"site":                id.Site,
				"identity_generation": id.Generation,
				"attestor":            id.Attestor,
				"key":                 id.KeyKind,
				"serial":              fmt.Sprintf("%x", st.Leaf.SerialNumber),
				"not_before":          st.Leaf.NotBefore.UTC().Format(time.RFC3339),
				"not_after":           st.Leaf.NotAfter.UTC().Format(time.RFC3339),
				"data_dir":            dir,
			}
			w := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			expired := ""
			if time.Now().After(st.Leaf.NotAfter) {
				expired = " (EXPIRED: bcd join --reset --yes, then bcd join)"
			}
			fmt.Fprintf(w, "node:         %s\n", id.NodeID)
			fmt.Fprintf(w, "spiffe id:    %s\n", id.SPIFFEID)
			fmt.Fprintf(w, "role:         %s\n", id.Role)
			fmt.Fprintf(w, "site:         %s\n", siteOrDash(id.Site))
			fmt.Fprintf(w, "generation:   %d\n", id.Generation)
			fmt.Fprintf(w, "key:          %s (%s)\n", id.KeyKind, filepath.Join(dir, identity.FileKey))
			fmt.Fprintf(w, "certificate:  %x\n", st.Leaf.SerialNumber)
			fmt.Fprintf(w, "valid until:  %s%s\n", st.Leaf.NotAfter.UTC().Format(time.RFC3339), expired)
			return nil
		},
	}
	c.Flags().StringVar(&cfgPath, "config", config.DefaultBCDConfig, "path of config.toml")
	c.Flags().StringVar(&dataDir, "data-dir", "", "where the identity lives (overrides config.toml)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
