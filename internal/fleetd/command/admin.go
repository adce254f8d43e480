package command

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// adminFlags are shared by every command that talks to a running server.
type adminFlags struct {
	config     string
	credential string
	server     string
	json       bool
}

// The files of an admin credential folder (fleetd admin create).
const (
	credCertFile   = "admin.crt"
	credKeyFile    = "admin.key"
	credBundleFile = "pki-bundle.json"
)

func (f *adminFlags) register(c *cobra.Command) {
	f.registerConnection(c)
	c.Flags().BoolVar(&f.json, "json", false, "print JSON")
}

// registerConnection registers the flags that say how to reach the server
// and as whom, without --json.
func (f *adminFlags) registerConnection(c *cobra.Command) {
	c.Flags().StringVar(&f.config, "config", envOr("FLEETD_CONFIG", "fleetd.toml"), "path of fleetd.toml: the server address and the pki_dir holding the owner credential (env FLEETD_CONFIG)")
	c.Flags().StringVar(&f.credential, "credential", os.Getenv("FLEETD_CREDENTIAL"), "an admin credential folder from 'fleetd admin create' to call as, instead of the owner credential in pki_dir (env FLEETD_CREDENTIAL)")
	c.Flags().StringVar(&f.server, "server", os.Getenv("FLEETD_SERVER"), "fleetd's address host:port; default: listen in fleetd.toml (env FLEETD_SERVER)")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// identity is the credential and pins a command calls with.
type identity struct {
	cert   tls.Certificate
	bundle *pki.Bundle
	// bundlePath is the pki-bundle.json the pins came from.
	bundlePath string
}

// identity loads the admin credential: --credential's folder, else the
// owner credential in fleetd.toml's pki_dir.
func (f *adminFlags) identity() (*identity, *config.Fleetd, error) {
	var cfg *config.Fleetd
	if f.credential == "" || f.server == "" {
		var err error
		if cfg, err = config.LoadFleetd(f.config); err != nil {
			if f.credential != "" {
				return nil, nil, fmt.Errorf("%w (or give --server with --credential)", err)
			}
			return nil, nil, err
		}
	}
	certPath, keyPath, bundlePath := "", "", ""
	if f.credential != "" {
		certPath, keyPath, bundlePath = filepath.Join(f.credential, credCertFile), filepath.Join(f.credential, credKeyFile), filepath.Join(f.credential, credBundleFile)
	} else {
		dir := cfg.Resolve(cfg.PKIDir)
		certPath, keyPath, bundlePath = filepath.Join(dir, pki.OwnerCertFile), filepath.Join(dir, pki.OwnerKeyFile), filepath.Join(dir, pki.BundleFile)
	}
	b, err := pki.ReadBundle(bundlePath)
	if err != nil {
		return nil, nil, err
	}
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("load the admin credential %s: %w", certPath, err)
	}
	return &identity{cert: cert, bundle: b, bundlePath: bundlePath}, cfg, nil
}

// dial connects to the server with the admin credential.
func (f *adminFlags) dial() (adminv1.AdminClient, func(), error) {
	id, cfg, err := f.identity()
	if err != nil {
		return nil, nil, err
	}
	addr := f.server
	if addr == "" {
		addr = cfg.AdminAddress()
	}
	cert := id.cert
	tc := tlspin.Client(id.bundle.ServingCASPKIPin, id.bundle.ServerName, func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil })
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, nil, fmt.Errorf("dial fleetd at %s: %w", addr, err)
	}
	return adminv1.NewAdminClient(conn), func() { conn.Close() }, nil
}

// open dials the server and returns a client, a context bounding the call,
// and a function that releases both.
func (f *adminFlags) open(cmd *cobra.Command) (adminv1.AdminClient, context.Context, func(), error) {
	client, closeConn, err := f.dial()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := callCtx(cmd.Context())
	return client, ctx, func() { cancel(); closeConn() }, nil
}

func callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 30*time.Second)
}

// rpcError turns a call's status into a message for the operator.
func rpcError(what string, err error) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Errorf("%s: %s (%s); is fleetd serving at the address in fleetd.toml?", what, st.Message(), st.Code())
	}
	return fmt.Errorf("%s: %s (%s)", what, st.Message(), st.Code())
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func timeOrDash(unix int64) string {
	if unix == 0 {
		return "-"
	}
	return time.Unix(unix, 0).UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
