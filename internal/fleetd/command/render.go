package command

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/render/talos"
)

func renderCommand() *cobra.Command {
	c := &cobra.Command{Use: "render", Short: "Machine-config rendering: make a Talos cluster's secrets bundle (docs/install.md)"}
	c.AddCommand(renderSecretsCommand())
	return c
}

func renderSecretsCommand() *cobra.Command {
	var out, talosVersion string
	c := &cobra.Command{
		Use:   "secrets --out FILE [--talos-version V]",
		Short: "Write a new Talos cluster secrets bundle for a [render.CLASS] section's secrets_file",
		Long: `secrets writes a new secrets bundle for a Talos cluster — its CAs, keys and
tokens, in the format talosctl gen secrets writes — to --out with mode 0600.
Name the file as secrets_file in each [render.CLASS] section of kind "talos"
whose machines join that cluster.

Make a cluster's bundle once: machines rendered with another bundle do not
join the same cluster. The command never replaces an existing file. The bundle
holds the cluster's private keys: keep it as you keep fleetd's own keys, and
back it up. --talos-version is the version contract of the configs
(talos_version in the section, e.g. v1.11); default: the machinery library's
own (v1.11.5).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return cli.Usagef("render secrets needs --out FILE (a new file; it is never replaced)")
			}
			if err := talos.GenerateSecrets(out, talosVersion); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote the Talos secrets bundle %s (mode 0600); name it as secrets_file in [render.CLASS]\n", out)
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "the new bundle file (never replaced)")
	c.Flags().StringVar(&talosVersion, "talos-version", "", "the Talos version contract, e.g. v1.11 (default: the library's)")
	return c
}
