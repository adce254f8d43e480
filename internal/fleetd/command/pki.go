package command

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/pkcs11key"
	"github.com/nodetrust/nodetrust/pki"
)

func pkiCommand() *cobra.Command {
	c := &cobra.Command{Use: "pki", Short: "Look at the control plane's PKI"}
	c.AddCommand(pkiShowCommand())
	return c
}

// keyRow is one line of pki show.
type keyRow struct {
	Key         string `json:"key"`
	Description string `json:"description"`
	Where       string `json:"where"`
	InFile      bool   `json:"in_file"`
	Certificate string `json:"certificate,omitempty"`
	Subject     string `json:"subject,omitempty"`
	NotAfter    string `json:"not_after,omitempty"`
	Pin         string `json:"pin,omitempty"`
	Check       string `json:"check,omitempty"`
}

// keyCerts names the certificate of each key that has one.
var keyCerts = map[pki.KeyUse]string{
	pki.KeyRootCA:    pki.RootCACertFile,
	pki.KeyNodeCA:    pki.NodeCACertFile,
	pki.KeyDevIDCA:   pki.DevIDCACertFile,
	pki.KeyServingCA: pki.ServingCACertFile,
	pki.KeyServing:   pki.ServingCertFile,
	pki.KeyAdminCA:   pki.AdminCACertFile,
}

func pkiShowCommand() *cobra.Command {
	var (
		cfgPath, dir string
		asJSON, chk  bool
	)
	c := &cobra.Command{
		Use:   "show [--config fleetd.toml | --dir D] [--check]",
		Short: "Say where each key of the PKI lives: a file, a PKCS#11 token, or not here",
		Long: `show lists each private key of the PKI (root CA, node CA, DevID CA, serving CA,
serving key, JoinService signing key), where it lives — a PKCS#8 file in the PKI
folder, a PKCS#11 token (its URI), or not here (kept offline) — and its
certificate or pin. --check also opens each key that is here, through its token
with the module and PIN file of --config, signs a test digest and checks it
against the certificate or pin. The join encryption key is always a file
(join-encryption.key); see docs/pki.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var p11 pkcs11key.Config
			switch {
			case cfgPath != "" && dir != "":
				return cli.Usagef("pki show takes --config or --dir, not both")
			case cfgPath != "":
				cfg, err := config.LoadFleetd(cfgPath)
				if err != nil {
					return err
				}
				dir = cfg.Resolve(cfg.PKIDir)
				p11 = pkcs11key.Config{Module: cfg.PKCS11.Module, PINFile: cfg.Resolve(cfg.PKCS11.PINFile)}
			case dir == "":
				return cli.Usagef("pki show needs --config fleetd.toml or --dir D")
			}
			bundle, err := pki.ReadBundle(pki.Path(dir, pki.BundleFile))
			if err != nil {
				return err
			}
			locs, err := pki.LocateKeys(dir)
			if err != nil {
				return err
			}
			keys := pkcs11key.New(p11)
			defer keys.Close()
			var rows []keyRow
			failed := 0
			for _, l := range locs {
				r := keyRow{Key: string(l.Use), Description: l.Use.Description(), Where: l.Where(), InFile: l.File != ""}
				var want crypto.PublicKey
				if name, ok := keyCerts[l.Use]; ok {
					certs, err := pki.ReadCerts(pki.Path(dir, name))
					if err != nil && l.File == "" && l.Ref == "" && errors.Is(err, fs.ErrNotExist) {
						// A key this PKI does not have (the admin CA of a
						// PKI made before it): nothing to show or check.
						rows = append(rows, r)
						continue
					}
					if err != nil {
						return err
					}
					r.Certificate, r.Subject = name, certs[0].Subject.String()
					r.NotAfter = certs[0].NotAfter.UTC().Format(time.RFC3339)
					want = certs[0].PublicKey
				} else {
					r.Pin = bundle.JoinSigningKeyPin.String()
				}
				if chk && (l.File != "" || l.Ref != "") {
					r.Check = "ok"
					if err := checkKey(keys, l, want, bundle.JoinSigningKeyPin); err != nil {
						r.Check = err.Error()
						failed++
					}
				}
				rows = append(rows, r)
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), rows); err != nil {
					return err
				}
			} else {
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				head := "KEY\tWHERE\tCERTIFICATE OR PIN\tNOT AFTER"
				if chk {
					head += "\tCHECK"
				}
				fmt.Fprintln(tw, head)
				for _, r := range rows {
					what := r.Certificate + " (" + r.Subject + ")"
					if r.Certificate == "" {
						what = "join_signing_key_pin " + r.Pin
					}
					line := fmt.Sprintf("%s\t%s\t%s\t%s", r.Key, r.Where, what, orDash(r.NotAfter))
					if chk {
						line += "\t" + orDash(r.Check)
					}
					fmt.Fprintln(tw, line)
				}
				fmt.Fprintf(tw, "join-encryption\tfile %s\t%s %s\t-\n", pki.Path(dir, pki.JoinEncryptionKeyFile), "join_encryption_key_pin", bundle.JoinEncryptionKeyPin)
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d key(s) failed the check; see the CHECK column", failed)
			}
			return nil
		},
	}
	c.Flags().StringVar(&cfgPath, "config", "", "fleetd.toml: its pki_dir, and its [pkcs11] module and PIN file for --check")
	c.Flags().StringVar(&dir, "dir", "", "the PKI folder fleetd init wrote")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().BoolVar(&chk, "check", false, "open each key that is here and check that it signs for its certificate or pin")
	return c
}

// checkKey opens the key at l, signs a digest and verifies it under want
// (the certificate's key), or for the join signing key under its pin.
func checkKey(keys *pkcs11key.Keys, l pki.KeyLocation, want crypto.PublicKey, joinPin pki.Pin) error {
	var (
		s   crypto.Signer
		err error
	)
	if l.File != "" {
		s, err = pki.ReadPrivateKey(l.File)
	} else {
		s, err = keys.Open(l.Use, l.Ref)
	}
	if err != nil {
		return err
	}
	if want == nil {
		pin, err := pki.PinOf(s.Public())
		if err != nil {
			return err
		}
		if !pin.Equal(joinPin) {
			return fmt.Errorf("key pin %s is not join_signing_key_pin %s", pin, joinPin)
		}
		want = s.Public()
	}
	pub, ok := want.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("certificate key is %T, want ECDSA", want)
	}
	d := sha256.Sum256([]byte("fleetd pki show --check"))
	sig, err := s.Sign(rand.Reader, d[:], crypto.SHA256)
	if err != nil {
		return err
	}
	if !ecdsa.VerifyASN1(pub, d[:], sig) {
		return fmt.Errorf("the key does not match its certificate")
	}
	return nil
}
