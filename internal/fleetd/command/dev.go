package command

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/devswtpm"
	"github.com/nodetrust/nodetrust/pki"
)

// Dev's fixed names inside its folder.
const (
	devTrustDomain = "dev.nodetrust.test"
	devServerName  = "localhost"
	devTokenFile   = "join-token"
	devEnvFile     = "dev.env"
)

func devCommand() *cobra.Command {
	var (
		dir, listen, role, lifetime, logLevel string
		keep, swtpm                           bool
		ekRoots, ekIntermediates              []string
	)
	c := &cobra.Command{
		Use:   "dev",
		Short: "Run a complete control plane on loopback with embedded defaults",
		Long: `dev makes a PKI, a fleetd.toml and a SQLite store in a temporary folder (or --dir),
serves on loopback, creates a join token, and prints the bcd join command that
uses it. It writes dev.env (shell variables) beside them for scripts. Stop it
with Ctrl-C; the temporary folder is removed unless --keep or --dir is given.

TPM joins: --ek-roots FILE (and --ek-intermediates FILE) trust TPM
manufacturers' certificates as fleetd.toml's [tpm] ek_roots does. --swtpm
starts a software TPM (swtpm, Debian's swtpm and swtpm-tools) on loopback whose
EK certificate comes from a throwaway CA of its own, trusts that CA, and prints
the bcd join --attestor tpm command for it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			temp := dir == ""
			if temp {
				d, err := os.MkdirTemp("", "fleetd-dev-")
				if err != nil {
					return err
				}
				dir = d
				if !keep {
					defer os.RemoveAll(dir)
				}
			}
			dir, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			lifetimeD, err := time.ParseDuration(lifetime)
			if err != nil {
				return cli.Usagef("--node-cert-lifetime: %v", err)
			}
			pkiDir := filepath.Join(dir, "pki")
			if _, err := os.Stat(filepath.Join(pkiDir, pki.BundleFile)); os.IsNotExist(err) {
				if _, err := pki.Init(pkiDir, pki.InitOptions{TrustDomain: devTrustDomain, ServerName: devServerName}); err != nil {
					return err
				}
			}
			var sw *devswtpm.TPM
			if swtpm {
				if sw, err = devswtpm.Start(ctx, filepath.Join(dir, "swtpm")); err != nil {
					return err
				}
				defer sw.Stop()
				ekRoots = append(ekRoots, sw.RootCert())
				ekIntermediates = append(ekIntermediates, sw.IssuerCert())
			}
			tpmSection, err := devTPMSection(ekRoots, ekIntermediates)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			cfgPath := filepath.Join(dir, "fleetd.toml")
			cfgText := fmt.Sprintf("# Written by fleetd dev.\npki_dir = %q\ndata_dir = %q\nlisten = %q\nnode_cert_lifetime = %q\nlog_level = %q\n%s",
				"pki", "data", ln.Addr().String(), lifetimeD.String(), logLevel, tpmSection)
			if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
				ln.Close()
				return err
			}
			cfg, err := config.LoadFleetd(cfgPath)
			if err != nil {
				ln.Close()
				return err
			}
			log := cli.NewLogger(cmd.ErrOrStderr(), cfg.LogLevel)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			readyErr := make(chan error, 1)
			err = fleetd.Run(ctx, fleetd.Options{
				Config:   cfg,
				Logger:   log,
				Listener: ln,
				Ready: func(addr, _ string) {
					go func() {
						err := devReady(ctx, cmd.OutOrStdout(), dir, cfgPath, addr, role, sw)
						readyErr <- err
						if err != nil {
							cancel()
						}
					}()
				},
			})
			select {
			case rerr := <-readyErr:
				if rerr != nil {
					return rerr
				}
			default:
			}
			return err
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "keep the control plane's state in this folder (reused if it exists)")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "gRPC address (port 0 picks a free one)")
	c.Flags().StringVar(&role, "role", "worker", "role of the printed join token")
	c.Flags().StringVar(&lifetime, "node-cert-lifetime", "24h", "lifetime of node certificates")
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	c.Flags().BoolVar(&keep, "keep", false, "keep the temporary folder when dev stops")
	c.Flags().StringSliceVar(&ekRoots, "ek-roots", nil, "PEM file of TPM manufacturer root certificates to trust for TPM joins (repeatable; [tpm] ek_roots)")
	c.Flags().StringSliceVar(&ekIntermediates, "ek-intermediates", nil, "PEM file of TPM manufacturer intermediate certificates ([tpm] ek_intermediates)")
	c.Flags().BoolVar(&swtpm, "swtpm", false, "start a software TPM with an EK certificate from a throwaway CA, trust that CA, and print the TPM join command")
	return c
}

// devTPMSection is fleetd.toml's [tpm] section for the EK certificates
// given, with absolute paths; "" when there are none. Each file must hold a
// certificate.
func devTPMSection(roots, inters []string) (string, error) {
	if len(roots) == 0 && len(inters) == 0 {
		return "", nil
	}
	if len(roots) == 0 {
		return "", cli.Usagef("--ek-intermediates needs --ek-roots: intermediates are trusted only under a root")
	}
	list := func(flag string, files []string) (string, error) {
		var q []string
		for _, f := range files {
			abs, err := filepath.Abs(f)
			if err != nil {
				return "", err
			}
			if _, err := pki.ReadCerts(abs); err != nil {
				return "", cli.Usagef("%s %s: %v", flag, f, err)
			}
			q = append(q, strconv.Quote(abs))
		}
		return "[" + strings.Join(q, ", ") + "]", nil
	}
	r, err := list("--ek-roots", roots)
	if err != nil {
		return "", err
	}
	i, err := list("--ek-intermediates", inters)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("\n[tpm]\nek_roots = %s\nek_intermediates = %s\n", r, i), nil
}

// devReady creates the first token and tells the user how to join.
func devReady(ctx context.Context, out io.Writer, dir, cfgPath, addr, role string, sw *devswtpm.TPM) error {
	f := adminFlags{config: cfgPath}
	client, done, err := f.dial()
	if err != nil {
		return err
	}
	defer done()
	cctx, cancel := callCtx(ctx)
	defer cancel()
	resp, err := client.CreateToken(cctx, &adminv1.CreateTokenRequest{Role: role})
	if err != nil {
		return rpcError("create the dev token", err)
	}
	tokenPath := filepath.Join(dir, devTokenFile)
	if err := os.WriteFile(tokenPath, []byte(resp.Token+"\n"), 0o600); err != nil {
		return err
	}
	b, err := pki.ReadBundle(filepath.Join(dir, "pki", pki.BundleFile))
	if err != nil {
		return err
	}
	nodeDir := filepath.Join(dir, "node")
	args := []string{
		"bcd join",
		"--server " + addr,
		"--serving-ca-spki-pin " + b.ServingCASPKIPin.String(),
		"--join-signing-key-pin " + b.JoinSigningKeyPin.String(),
		"--join-encryption-key-pin " + b.JoinEncryptionKeyPin.String(),
		"--data-dir " + nodeDir,
		"--token-file " + tokenPath,
	}
	env := fmt.Sprintf("FLEETD_DEV_DIR=%q\nFLEETD_CONFIG=%q\nFLEETD_SERVER=%q\nBCD_DATA_DIR=%q\nBCD_TOKEN_FILE=%q\nSERVING_CA_SPKI_PIN=%q\nJOIN_SIGNING_KEY_PIN=%q\nJOIN_ENCRYPTION_KEY_PIN=%q\n",
		dir, cfgPath, addr, nodeDir, tokenPath, b.ServingCASPKIPin, b.JoinSigningKeyPin, b.JoinEncryptionKeyPin)
	tpmNote := ""
	if sw != nil {
		// The TPM join: the token is needed once, for an EK the control
		// plane does not know yet; after bcd join --reset --yes the same
		// command without the token reclaims the node.
		args = append(args[:1], append([]string{"--attestor tpm", "--tpm " + sw.Spec()}, args[1:]...)...)
		env += fmt.Sprintf("BCD_TPM=%q\n", sw.Spec())
		tpmNote = fmt.Sprintf(`
This is a TPM join: a software TPM serves %s (state in %s), its EK
certificate signed by a throwaway CA that this control plane trusts
([tpm] ek_roots). The token is needed once; after bcd join --reset --yes the
same command without --token-file brings the node back by its EK.
`, sw.Spec(), sw.Dir)
	}
	if err := os.WriteFile(filepath.Join(dir, devEnvFile), []byte(env), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(out, `fleetd dev: control plane for trust domain %s on %s
state in %s

Join a node (the token is in %s, single use, expires %s):

  %s
%s
See the nodes:

  fleetd nodes list --config %s

More tokens:  fleetd token create --role %s --config %s
Stop with Ctrl-C.
`, devTrustDomain, addr, dir, tokenPath, timeOrDash(resp.Info.ExpiresUnix), strings.Join(args, " \\\n    "), tpmNote, cfgPath, role, cfgPath)
	return nil
}
