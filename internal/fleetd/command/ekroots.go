package command

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/ekroots"
)

func ekRootsCommand() *cobra.Command {
	c := &cobra.Command{Use: "ek-roots", Short: "Check a TPM manufacturer root bundle (docs/attestor-tpm.md)"}
	c.AddCommand(ekRootsCheckCommand())
	return c
}

func ekRootsCheckCommand() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "check DIR",
		Short: "Parse every vendor CA certificate of a root bundle folder and name what is wrong",
		Long: `check reads every certificate file of DIR (*.pem, *.crt, *.cer, *.der; PEM files
may hold several certificates) as fleetd serve does for [tpm] ek_roots_dir, and
prints each certificate: root (self-signed, a trust anchor) or intermediate
(builds chains, trusted only through a root), subject, expiry and SHA-256.

Errors (fleetd serve refuses to start on them): a file that does not parse, a
certificate that is not a CA (an EK certificate put there by mistake), an
expired or not yet valid certificate, a self-signed certificate whose
signature does not verify. Warnings: the same certificate in two files, a
certificate that ends within 90 days, an intermediate whose issuer is not in
the folder. Exit status: 0 without errors, 1 with errors, 2 for a
command-line mistake.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("ek-roots check needs one folder: fleetd ek-roots check DIR")
			}
			b, err := ekroots.Load(args[0], time.Now())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := printJSON(out, b); err != nil {
					return err
				}
			} else {
				printBundle(out, b)
			}
			if b.HasErrors() {
				return &cli.ExitError{Code: cli.ExitFailure}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the certificates and problems as JSON")
	return c
}

func printBundle(w io.Writer, b *ekroots.Bundle) {
	roots, inters := 0, 0
	for _, e := range b.Entries {
		switch e.Kind {
		case ekroots.Root:
			roots++
		case ekroots.Intermediate:
			inters++
		}
		fmt.Fprintf(w, "%-12s %s  until %s  %s  (%s)\n", e.Kind, e.SHA256, e.NotAfter.UTC().Format(time.DateOnly), e.Subject, e.File)
	}
	for _, s := range b.Skipped {
		fmt.Fprintf(w, "skipped      %s (not a certificate file by name)\n", s)
	}
	errs := 0
	for _, p := range b.Problems {
		level := "warning"
		if p.Error {
			level, errs = "ERROR", errs+1
		}
		fmt.Fprintf(w, "%s: %s: %s\n", level, p.File, p.Message)
	}
	fmt.Fprintf(w, "%d roots, %d intermediates, %d errors, %d warnings\n", roots, inters, errs, len(b.Problems)-errs)
}
