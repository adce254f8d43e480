package command

import (
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fileperm"
	"github.com/nodetrust/nodetrust/pki"
)

func initCommand() *cobra.Command {
	var (
		dir, td, name, kem string
		ips                []string
		addAdminCA         bool
	)
	c := &cobra.Command{
		Use:   "init --dir D --trust-domain T --server-name N",
		Short: "Create the control plane's PKI: CAs, serving certificate, join keys, owner credential",
		Long: `init writes, into --dir: a root CA, a node-issuing CA, a serving CA and serving
certificate, the JoinService signing key, the join encryption key (and its public
half as join-encryption.jwk), an admin CA and the owner admin credential it
issues (admin/, role owner), and pki-bundle.json with the three pins an install
script gives to nodes.
Private keys are PKCS#8 files with mode 0600. It refuses to overwrite anything,
and refuses a --dir that other users may write or another user owns (the
message gives the chmod or chown to run).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addAdminCA {
				if dir == "" {
					return cli.Usagef("init --add-admin-ca needs --dir")
				}
				if err := pki.AddAdminCA(dir, time.Time{}); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "admin CA added to %s; restart fleetd, then fleetd admin create makes credentials (the owner credential in admin/ keeps working)\n", dir)
				return nil
			}
			if dir == "" || td == "" || name == "" {
				return cli.Usagef("init needs --dir, --trust-domain and --server-name")
			}
			var parsed []net.IP
			for _, s := range ips {
				ip := net.ParseIP(s)
				if ip == nil {
					return cli.Usagef("--server-ip %q is not an IP address", s)
				}
				parsed = append(parsed, ip)
			}
			if err := fileperm.CheckDir(dir, "the PKI folder", 0o700); err != nil {
				return err
			}
			b, err := pki.Init(dir, pki.InitOptions{TrustDomain: td, ServerName: name, ServerIPs: parsed, KEM: kem})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "PKI for trust domain %s written to %s\n", b.TrustDomain, dir)
			fmt.Fprintf(out, "  serving_ca_spki_pin     = %q\n", b.ServingCASPKIPin)
			fmt.Fprintf(out, "  join_signing_key_pin    = %q\n", b.JoinSigningKeyPin)
			fmt.Fprintf(out, "  join_encryption_key_pin = %q\n", b.JoinEncryptionKeyPin)
			fmt.Fprintf(out, "The pins are also in %s. Next: write fleetd.toml with pki_dir = %q, then fleetd serve --config fleetd.toml\n",
				filepath.Join(dir, "pki-bundle.json"), dir)
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "folder to write the PKI into (created 0700)")
	c.Flags().StringVar(&td, "trust-domain", "", "SPIFFE trust domain, e.g. fleet.example.org")
	c.Flags().StringVar(&name, "server-name", "", "DNS name nodes use to reach fleetd (in the serving certificate)")
	c.Flags().StringSliceVar(&ips, "server-ip", nil, "IP addresses for the serving certificate (default 127.0.0.1 and ::1)")
	c.Flags().StringVar(&kem, "kem", pki.KEMP256, "join encryption KEM: p256, or mlkem768-p256 (post-quantum hybrid)")
	c.Flags().BoolVar(&addAdminCA, "add-admin-ca", false, "add the admin CA to a --dir made before it existed (needs root-ca.key there)")
	return c
}
