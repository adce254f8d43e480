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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// adminFlags are shared by every command that talks to a running server.
type adminFlags struct {
	config string
	json   bool
}

func (f *adminFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.config, "config", envOr("FLEETD_CONFIG", "fleetd.toml"), "path of fleetd.toml: the server address and the pki_dir holding the owner credential (env FLEETD_CONFIG)")
	c.Flags().BoolVar(&f.json, "json", false, "print JSON")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// dial connects to the server in fleetd.toml with the owner credential.
func (f *adminFlags) dial() (adminv1.AdminClient, func(), error) {
	cfg, err := config.LoadFleetd(f.config)
	if err != nil {
		return nil, nil, err
	}
	dir := cfg.Resolve(cfg.PKIDir)
	b, err := pki.ReadBundle(filepath.Join(dir, pki.BundleFile))
	if err != nil {
		return nil, nil, err
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, pki.OwnerCertFile), filepath.Join(dir, pki.OwnerKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("load the owner credential: %w", err)
	}
	tc := tlspin.Client(b.ServingCASPKIPin, b.ServerName, func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil })
	conn, err := grpc.NewClient("passthrough:///"+cfg.AdminAddress(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, nil, fmt.Errorf("dial fleetd at %s: %w", cfg.AdminAddress(), err)
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
	return fmt.Errorf("%s: %s (%s); is fleetd serving at the address in fleetd.toml?", what, st.Message(), st.Code())
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
