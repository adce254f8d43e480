package command

import (
	"crypto"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/pki"
)

func adminCommand() *cobra.Command {
	c := &cobra.Command{Use: "admin", Short: "Create, list and revoke admin credentials (owner, declarer, operator, auditor)"}
	c.AddCommand(adminCreateCommand(), adminListCommand(), adminRevokeCommand())
	return c
}

func adminCreateCommand() *cobra.Command {
	var (
		f               adminFlags
		name, role, out string
		ttl             time.Duration
	)
	c := &cobra.Command{
		Use:   "create --name N --role R [--out DIR]",
		Short: "Create an admin credential with one role; only the owner may",
		Long: `create makes a key here, has fleetd's admin CA certify it with the name and
role, and writes the credential folder --out (default ./admin-NAME, mode 0700):
admin.crt, admin.key and pki-bundle.json, each mode 0600. The key never leaves
this machine. Use it with --credential DIR on any admin command.

Roles: owner (everything), declarer (the inventory and EK bindings, nothing
else), operator (lifecycle actions but retirement, tokens), auditor (read only).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" || role == "" {
				return cli.Usagef("admin create needs --name and --role")
			}
			if _, err := roles.Parse(role); err != nil {
				return cli.Usagef("--role: %v", err)
			}
			if out == "" {
				out = "admin-" + name
			}
			if entries, err := os.ReadDir(out); err == nil && len(entries) > 0 {
				return fmt.Errorf("%s exists and is not empty: choose another --out", out)
			} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			id, _, err := f.identity()
			if err != nil {
				return err
			}
			key, err := pki.GenerateKey()
			if err != nil {
				return err
			}
			csr, err := pki.CreateCSR(key)
			if err != nil {
				return err
			}
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.CreateAdmin(ctx, &adminv1.CreateAdminRequest{Name: name, Role: role, Csr: csr, TtlSeconds: int64(ttl / time.Second)})
			if err != nil {
				return rpcError("create admin "+name, err)
			}
			if err := writeCredential(out, key, resp, id.bundlePath); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"dir": out, "admin": resp.Admin})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "admin credential %s (role %s) written to %s; valid until %s\nuse it with: --credential %s\n",
				name, resp.Admin.Role, out, timeOrDash(resp.Admin.NotAfterUnix), out)
			return nil
		},
	}
	f.register(c)
	c.Flags().StringVar(&name, "name", "", "the credential's name (recorded with everything it does)")
	c.Flags().StringVar(&role, "role", "", "owner, declarer, operator or auditor")
	c.Flags().StringVar(&out, "out", "", "the folder to write (default ./admin-NAME)")
	c.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (default 2160h, 90 days)")
	return c
}

// writeCredential writes the credential folder: 0700, each file 0600.
func writeCredential(dir string, key crypto.PrivateKey, resp *adminv1.CreateAdminResponse, bundlePath string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return err
	}
	bundle, err := os.ReadFile(bundlePath)
	if err != nil {
		return err
	}
	certPEM := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: resp.Certificate}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: resp.AdminCa})...)
	for _, f := range []struct {
		name string
		data []byte
	}{{credKeyFile, keyPEM}, {credCertFile, certPEM}, {credBundleFile, bundle}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func adminListCommand() *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "list",
		Short: "List admin credentials, revoked ones included",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.ListAdmins(ctx, &adminv1.ListAdminsRequest{})
			if err != nil {
				return rpcError("list admins", err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), append([]*adminv1.AdminCredential{}, resp.Admins...))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tROLE\tSERIAL\tCREATED BY\tEXPIRES\tREVOKED")
			for _, a := range resp.Admins {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Name, a.Role, a.Serial, a.CreatedBy, timeOrDash(a.NotAfterUnix), timeOrDash(a.RevokedUnix))
			}
			return tw.Flush()
		},
	}
	f.register(c)
	return c
}

func adminRevokeCommand() *cobra.Command {
	var (
		f      adminFlags
		reason string
	)
	c := &cobra.Command{
		Use:   "revoke NAME --reason R",
		Short: "Revoke every credential of a name; its next call is refused",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if reason == "" {
				return cli.Usagef("admin revoke needs --reason")
			}
			client, ctx, done, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := client.RevokeAdmin(ctx, &adminv1.RevokeAdminRequest{Name: args[0], Reason: reason})
			if err != nil {
				return rpcError("revoke admin "+args[0], err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %d credential(s) of %s\n", len(resp.Revoked), args[0])
			return nil
		},
	}
	f.register(c)
	c.Flags().StringVar(&reason, "reason", "", "why (audited)")
	return c
}
