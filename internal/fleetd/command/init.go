package command

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fileperm"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/pkcs11key"
	"github.com/nodetrust/nodetrust/pki"
)

// defaultTokenKeys are the keys a bare --pkcs11 URI puts in its token: the
// CAs (the admin CA among them) and the JoinService signing key. The
// serving CA and serving key go there only when named (USE=URI): the
// serving key signs every TLS handshake, so a token gone would stop every
// connection, admin commands included.
var defaultTokenKeys = []pki.KeyUse{pki.KeyRootCA, pki.KeyNodeCA, pki.KeyDevIDCA, pki.KeyJoinSigning, pki.KeyAdminCA}

func initCommand() *cobra.Command {
	var (
		dir, td, name, kem, cfgPath string
		ips, tokenKeys              []string
		addAdminCA                  bool
		addDevIDCA                  bool
	)
	c := &cobra.Command{
		Use:   "init --dir D --trust-domain T --server-name N [--pkcs11 URI]",
		Short: "Create the control plane's PKI: CAs, serving certificate, join keys, owner credential",
		Long: `init writes, into --dir: a root CA, a node-issuing CA, a DevID CA, a serving CA
and serving certificate, the JoinService signing key, the join encryption key (and
its public half as join-encryption.jwk), an admin CA and the owner admin credential
it issues (admin/, role owner), and pki-bundle.json with the three pins an install
script gives to nodes.
Private keys are PKCS#8 files with mode 0600. It refuses to overwrite anything,
and refuses a --dir that other users may write or another user owns (the
message gives the chmod or chown to run).

--pkcs11 makes keys inside PKCS#11 tokens instead (RFC 7512 URIs) and writes only
their certificates, pins and <use>.keyref files naming them:

  --pkcs11 'pkcs11:token=fleet'                   the root, node, DevID and admin CAs and
                                                  the JoinService signing key in token
                                                  "fleet", labelled nodetrust-<use>;
                                                  object=P makes the labels P-<use>
  --pkcs11 'root-ca=pkcs11:token=offline;object=root'
                                                  one key in its own token and label
  --pkcs11 join-signing=file                      one key as a file after all

A key gets a random id unless its URI names one (id=%02 — a YubiKey's PIV
module picks the slot by id).

Uses: root-ca, node-ca, devid-ca, admin-ca, serving-ca, serving, join-signing.
The module and the PIN come from the URI (?module-path=…&pin-source=FILE) or from the
[pkcs11] section of --config; never put a PIN on the command line.
See docs/pki.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addDevIDCA {
				if dir == "" {
					return cli.Usagef("init --add-devid-ca needs --dir")
				}
				if err := pki.AddDevIDCA(dir, time.Time{}); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "DevID CA added to %s; restart fleetd, then bcd intake can get device certificates\n", dir)
				return nil
			}
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
			var p11 pkcs11key.Config
			if cfgPath != "" {
				cfg, err := config.LoadFleetd(cfgPath)
				if err != nil {
					return err
				}
				p11 = pkcs11key.Config{Module: cfg.PKCS11.Module, PINFile: cfg.Resolve(cfg.PKCS11.PINFile)}
				if dir == "" {
					dir = cfg.Resolve(cfg.PKIDir)
				}
			}
			if dir == "" || td == "" || name == "" {
				return cli.Usagef("init needs --dir (or --config), --trust-domain and --server-name")
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
			places, err := parseKeyPlaces(tokenKeys)
			if err != nil {
				return cli.Usagef("--pkcs11: %v", err)
			}
			keys := pkcs11key.New(p11)
			defer keys.Close()
			external := map[pki.KeyUse]pki.KeyGenerator{}
			for use, place := range places {
				external[use] = func(pki.KeyUse) (*pki.ExternalKey, error) {
					return keys.Generate(place.uri, place.label)
				}
			}
			b, err := pki.Init(dir, pki.InitOptions{TrustDomain: td, ServerName: name, ServerIPs: parsed, KEM: kem, ExternalKeys: external})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "PKI for trust domain %s written to %s\n", b.TrustDomain, dir)
			fmt.Fprintf(out, "  serving_ca_spki_pin     = %q\n", b.ServingCASPKIPin)
			fmt.Fprintf(out, "  join_signing_key_pin    = %q\n", b.JoinSigningKeyPin)
			fmt.Fprintf(out, "  join_encryption_key_pin = %q\n", b.JoinEncryptionKeyPin)
			if len(places) > 0 {
				locs, err := pki.LocateKeys(dir)
				if err != nil {
					return err
				}
				fmt.Fprintln(out, "Keys:")
				for _, l := range locs {
					fmt.Fprintf(out, "  %-13s %s\n", l.Use, l.Where())
				}
			}
			fmt.Fprintf(out, "The pins are also in %s. Next: write fleetd.toml with pki_dir = %q, then fleetd serve --config fleetd.toml\n",
				filepath.Join(dir, "pki-bundle.json"), dir)
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "folder to write the PKI into (created 0700); default the pki_dir of --config")
	c.Flags().StringVar(&td, "trust-domain", "", "SPIFFE trust domain, e.g. fleet.example.org")
	c.Flags().StringVar(&name, "server-name", "", "DNS name nodes use to reach fleetd (in the serving certificate)")
	c.Flags().StringSliceVar(&ips, "server-ip", nil, "IP addresses for the serving certificate (default 127.0.0.1 and ::1)")
	c.Flags().StringVar(&kem, "kem", pki.KEMP256, "join encryption KEM: p256, or mlkem768-p256 (post-quantum hybrid)")
	c.Flags().BoolVar(&addAdminCA, "add-admin-ca", false, "add the admin CA to a --dir made before it existed (needs root-ca.key there)")
	c.Flags().BoolVar(&addDevIDCA, "add-devid-ca", false, "add the DevID CA (device certificates of intake) to a --dir made before it existed (needs root-ca.key there)")
	c.Flags().StringArrayVar(&tokenKeys, "pkcs11", nil, "make keys inside a PKCS#11 token: URI (the CAs and the JoinService signing key), USE=URI or USE=file; repeatable (see above)")
	c.Flags().StringVar(&cfgPath, "config", "", "fleetd.toml whose [pkcs11] section names the module and PIN file (and whose pki_dir is the default --dir)")
	return c
}

// keyPlace is where --pkcs11 puts one key: a token and a label.
type keyPlace struct {
	uri   *pkcs11key.URI
	label string
}

// parseKeyPlaces reads the --pkcs11 values: a bare URI is the place of
// the default keys (its object, if any, the prefix of their labels);
// USE=URI places one key (its object, if any, the exact label); USE=file
// keeps one key a file.
func parseKeyPlaces(values []string) (map[pki.KeyUse]keyPlace, error) {
	places := map[pki.KeyUse]keyPlace{}
	named := map[pki.KeyUse]bool{}
	var def *pkcs11key.URI
	for _, v := range values {
		if strings.HasPrefix(v, "pkcs11:") {
			if def != nil {
				return nil, fmt.Errorf("two URIs for the default keys (%s, %s); name the use of one: USE=URI", def.TokenString(), v)
			}
			u, err := pkcs11key.ParseURI(v)
			if err != nil {
				return nil, err
			}
			if len(u.ID) > 0 {
				return nil, fmt.Errorf("%s names an id= for several keys; init gives each key its own id", v)
			}
			def = u
			continue
		}
		useName, where, ok := strings.Cut(v, "=")
		if !ok {
			return nil, fmt.Errorf("%q is neither a pkcs11: URI nor USE=URI or USE=file", v)
		}
		use, err := pki.ParseKeyUse(useName)
		if err != nil {
			return nil, err
		}
		if named[use] {
			return nil, fmt.Errorf("the %s key is named twice", use)
		}
		named[use] = true
		if where == "file" {
			continue
		}
		u, err := pkcs11key.ParseURI(where)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", use, err)
		}
		label := u.Object
		if label == "" {
			label = pkcs11key.DefaultLabelPrefix + "-" + string(use)
		}
		places[use] = keyPlace{uri: u, label: label}
	}
	if def != nil {
		prefix := def.Object
		if prefix == "" {
			prefix = pkcs11key.DefaultLabelPrefix
		}
		for _, use := range defaultTokenKeys {
			if !named[use] {
				places[use] = keyPlace{uri: def, label: prefix + "-" + string(use)}
			}
		}
	}
	return places, nil
}
