package command

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fleetd/console"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

func consoleCommand() *cobra.Command {
	var (
		f        adminFlags
		listen   string
		metrics  string
		logLevel string
	)
	c := &cobra.Command{
		Use:   "console [--config fleetd.toml] [--credential DIR] [--listen 127.0.0.1:PORT] [--metrics HOST:PORT]",
		Short: "Serve the web console on loopback, acting with an admin credential",
		Long: `console serves the fleet's web console on a loopback address and prints the address
to open with a one-time login code. The browser needs no client certificate: the
console calls the Admin API with the credential it is given (the owner credential in
pki_dir, or --credential DIR), like kubectl proxy, and the API checks that credential's
role for every action. Live figures are read from fleetd's /metrics on http_listen
(or --metrics). See docs/console.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			host, _, err := net.SplitHostPort(listen)
			if err != nil {
				return cli.Usagef("--listen %q: want host:port: %v", listen, err)
			}
			if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
				return cli.Usagef("--listen %q: the console serves on loopback only (127.0.0.1:PORT or [::1]:PORT); reach it from elsewhere through an SSH tunnel", listen)
			}
			id, cfg, err := f.identity()
			if err != nil {
				return err
			}
			name, role := credentialRole(id, f.credential == "")
			client, closeConn, err := f.dial()
			if err != nil {
				return err
			}
			defer closeConn()
			if metrics == "" && cfg != nil && cfg.HTTPListen != "" {
				metrics = loopbackIfUnspecified(cfg.HTTPListen)
			}
			log := cli.NewLogger(cmd.ErrOrStderr(), logLevel)
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("console: listen on %s: %w", listen, err)
			}
			cc := console.Config{Admin: client, Credential: name, Role: role, Addr: ln.Addr().String(), Logger: log, Verdicts: console.AdminVerdicts{Admin: client}}
			if metrics != "" {
				cc.Metrics = console.NewHTTPSMetrics(metrics, tlspin.Client(id.bundle.ServingCASPKIPin, id.bundle.ServerName, nil))
				cc.MetricsFrom = "https://" + metrics + "/metrics"
			}
			con, err := console.New(cc)
			if err != nil {
				ln.Close()
				return err
			}
			srv := &http.Server{Handler: con.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
				WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			go func() { _ = con.Run(ctx) }()
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			log.Info("console serving", "addr", ln.Addr().String(), "credential", name, "role", string(role))
			fmt.Fprintf(cmd.OutOrStdout(), "open %s\n(the login code in it works once, for 15 minutes)\n", con.LoginURL())
			select {
			case err := <-served:
				if !errors.Is(err, http.ErrServerClosed) {
					return fmt.Errorf("console: serve: %w", err)
				}
				return nil
			case <-ctx.Done():
			}
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			return srv.Shutdown(sctx)
		},
	}
	c.Flags().StringVar(&f.config, "config", envOr("FLEETD_CONFIG", "fleetd.toml"), "path of fleetd.toml: the server address, http_listen and the pki_dir holding the owner credential (env FLEETD_CONFIG)")
	c.Flags().StringVar(&f.credential, "credential", "", "an admin credential folder from 'fleetd admin create' to act as, instead of the owner credential in pki_dir (env FLEETD_CREDENTIAL)")
	c.Flags().StringVar(&f.server, "server", "", "fleetd's gRPC address host:port; default: listen in fleetd.toml (env FLEETD_SERVER)")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "loopback address to serve the console on; port 0 picks a free one")
	c.Flags().StringVar(&metrics, "metrics", "", "fleetd's HTTPS listener host:port to read /metrics from; default: http_listen in fleetd.toml")
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	c.PreRun = func(*cobra.Command, []string) {
		if f.credential == "" {
			f.credential = envOr("FLEETD_CREDENTIAL", "")
		}
		if f.server == "" {
			f.server = envOr("FLEETD_SERVER", "")
		}
	}
	return c
}

// credentialRole names the credential and its role, read from its
// certificate; the owner credential of a PKI made before the admin CA
// (issued by the serving CA) is the owner.
func credentialRole(id *identity, ownerFile bool) (string, roles.Role) {
	if leaf := id.cert.Leaf; leaf != nil {
		if info, err := pki.ParseAdminCert(leaf, id.bundle.TrustDomain); err == nil {
			if r, err := roles.Parse(info.Role); err == nil {
				return info.Name, r
			}
		}
	}
	if ownerFile {
		return "owner", roles.Owner
	}
	// Unknown: show no action (the API would decide anyway).
	return "unknown", roles.Auditor
}

func loopbackIfUnspecified(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
