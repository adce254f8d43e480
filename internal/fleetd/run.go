package fleetd

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fileperm"
	"github.com/nodetrust/nodetrust/internal/fleetd/actuator"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/debugserver"
	"github.com/nodetrust/nodetrust/internal/fleetd/ekroots"
	"github.com/nodetrust/nodetrust/internal/fleetd/export"
	"github.com/nodetrust/nodetrust/internal/fleetd/install"
	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/inventory/netbox"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/pkcs11key"
	"github.com/nodetrust/nodetrust/internal/fleetd/render"
	"github.com/nodetrust/nodetrust/internal/fleetd/render/renderers"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/spireexport"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
)

// Options configure Run.
type Options struct {
	Config *config.Fleetd
	Logger *slog.Logger
	// Listener, when set, is used instead of listening on Config.Listen
	// (fleetd dev binds first to learn its port).
	Listener net.Listener
	// Ready is called once both listeners accept connections.
	Ready func(grpcAddr, httpAddr string)
}

// Run serves the control plane until ctx is done.
func Run(ctx context.Context, o Options) error {
	cfg := o.Config
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Folders others could write would let them replace the CA keys or
	// the store: refuse them, with the chmod or chown to run.
	for _, d := range []struct{ what, path string }{{"the PKI folder (pki_dir)", cfg.Resolve(cfg.PKIDir)}, {"the data folder (data_dir)", cfg.Resolve(cfg.DataDir)}} {
		if err := fileperm.CheckDir(d.path, d.what, 0o700); err != nil {
			return err
		}
	}
	pkiDir := cfg.Resolve(cfg.PKIDir)
	keys := pkcs11key.New(pkcs11key.Config{
		Module:   cfg.PKCS11.Module,
		PINFile:  cfg.Resolve(cfg.PKCS11.PINFile),
		OnChange: func(ev pkcs11key.Event) { logTokenChange(log, ev) },
	})
	defer keys.Close()
	auth, err := pki.LoadAuthorityWith(pkiDir, keys.Open)
	if err != nil {
		return fmt.Errorf("load PKI: %w", err)
	}
	if locs, err := pki.LocateKeys(pkiDir); err == nil {
		for _, l := range locs {
			log.InfoContext(ctx, "PKI key", logkey.Key, string(l.Use), logkey.KeyWhere, l.Where())
		}
	}
	dataDir := cfg.Resolve(cfg.DataDir)
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("create data_dir: %w", err)
	}
	st, err := openStore(ctx, cfg)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()

	ekVerifier, err := ekVerifier(cfg)
	if err != nil {
		return err
	}
	limits, err := connectionLimits(cfg, openFileLimit(), log)
	if err != nil {
		return err
	}
	var source inventory.Source = inventory.StoreSource{Store: st}
	if cfg.Inventory.Source == "netbox" {
		if source, err = netboxSource(cfg); err != nil {
			return err
		}
	}
	boot, err := openBootPolicy(cfg, dataDir, log)
	if err != nil {
		return err
	}
	if boot.log != nil {
		defer boot.log.Close()
	}
	// [kubernetes]: the approver, the workers' bootstrap tokens, the
	// retirement's drain, and the cordon when [actuator] kind says so.
	kw, err := openKubernetes(cfg, st, log)
	if err != nil {
		return err
	}
	var releaseHooks []lifecycle.ReleaseHook
	if kw != nil && kw.cordoner != nil {
		boot.actuator = kw.cordoner
		releaseHooks = append(releaseHooks, kw.cordoner)
	}
	// Each class's machine-config renderer, read now so that a template
	// that does not parse or a secrets bundle that does not load stops the
	// start, naming the setting (docs/install.md). The install flow is to
	// render with it.
	renders, err := renderers.Load(cfg)
	if err != nil {
		return err
	}
	if cl := renders.Classes(); len(cl) > 0 {
		log.InfoContext(ctx, "machine-config renderers loaded", "classes", strings.Join(cl, ","))
	}
	kex, err := cfg.KeyExchanges()
	if err != nil {
		return err
	}
	// The SPIRE export's applier, when [export.spire] names a socket: on
	// an interval, and after each retirement.
	var spire *spireexport.Runner
	var hooks []lifecycle.RetireHook
	if sock := cfg.Export.SPIRE.Socket; sock != "" {
		client, err := spireexport.Dial(cfg.Resolve(sock), cfg.Export.SPIRE.PageSize)
		if err != nil {
			return fmt.Errorf("export.spire.socket: %w", err)
		}
		defer client.Close()
		spire = &spireexport.Runner{Applier: &spireexport.Applier{SPIRE: client, Threshold: cfg.Export.SPIRE.Threshold},
			Interval: cfg.Export.SPIRE.Interval.Duration, Log: log.With("component", "spire-export")}
		hooks = append(hooks, spire)
	}
	if kw != nil {
		hooks = append(hooks, kw.retirer)
	}
	srv, err := service.New(service.Config{
		BootPolicy:          boot.policies,
		VerdictLog:          boot.log,
		VerdictsKept:        cfg.BootPolicy.VerdictsKept,
		ControlPlaneClasses: cfg.BootPolicy.ControlPlaneClasses,
		BootCheckTimeout:    cfg.BootPolicy.BootCheckTimeout.Duration,
		StaleAfter:          cfg.BootPolicy.StaleAfter.Duration,
		IntakeClass:         cfg.Intake.Class,
		IntakeWindow:        cfg.Intake.Window.Duration,
		Actuator:            boot.actuator,

		Limits:                     limits,
		KeyExchanges:               kex,
		EKVerifier:                 ekVerifier,
		RequireEKCertificateAndPin: cfg.TPM.RequireEKCertificateAndPin,
		ChallengeTTL:               cfg.TPM.ChallengeTTL.Duration,
		Authority:                  auth,
		Store:                      st,
		Logger:                     log,
		NodeCertLifetime:           cfg.NodeCertLifetime.Duration,
		TokenTTL:                   cfg.TokenTTL.Duration,
		MaxTokenTTL:                cfg.MaxTokenTTL.Duration,
		RenewalLimit:               cfg.RenewalLimit,
		RenewalWindow:              cfg.RenewalWindow.Duration,
		RamdiskRoles:               cfg.RamdiskRoles,
		PendingPoll:                cfg.PendingPoll.Duration,

		AdvertiseAddresses: cfg.AdvertiseAddresses,

		Inventory:         source,
		InventoryClasses:  cfg.Inventory.Classes,
		InventoryRequired: cfg.Inventory.Required,
		AutoProvision:     cfg.Inventory.AutoProvision,
		MaxClaims:         cfg.Inventory.MaxClaims,

		RetireHooks:          hooks,
		ReleaseHooks:         releaseHooks,
		ExportEligibleStates: cfg.Export.EligibleStates,
	})
	if err != nil {
		return err
	}
	if spire != nil {
		spire.Applier.TrustDomain = auth.TrustDomain
		spire.Applier.Safeguards = serverSafeguards{srv}
		spire.Document = func(ctx context.Context) ([]byte, error) {
			b, _, err := srv.ExportDocument(ctx)
			return b, err
		}
	}

	// The config release (docs/install.md): GET /v1/config/{uuid} on the
	// HTTPS listener, and the sweep that activates released nodes.
	releaser, err := install.New(install.Config{Store: st, Logger: log, Registry: srv.MetricsRegistry(), TTL: cfg.Install.ConfigTTL.Duration,
		Activator: install.LifecycleActivator{Manager: srv.Lifecycle()}})
	if err != nil {
		return err
	}
	// The Install RPC renders with each class's renderer and issues the
	// code through the releaser (docs/install.md, "Admission").
	if len(renders.Classes()) > 0 {
		fl, err := render.FleetdFromPKI(pkiDir, cfg.Install.Server)
		if err != nil {
			return fmt.Errorf("install.server: %w", err)
		}
		set := service.InstallSettings{Releaser: releaser, Renderers: renders, Fleetd: fl,
			ReportMaxAge: cfg.Install.ReportMaxAge.Duration, ReportMaxSkew: cfg.Install.ReportMaxSkew.Duration,
			CredentialLifetime: cfg.Install.CredentialLifetime.Duration, ControlPlaneRoles: controlPlaneRoles(cfg.Render)}
		// Each issued install writes its Tinkerbell objects
		// (docs/install.md, "Tinkerbell").
		if cfg.Tinkerbell.Enabled() {
			prov, err := tinkerbellProvisioner(cfg)
			if err != nil {
				return err
			}
			set.Provisioner = prov
		}
		if kw != nil {
			// Signed by the JoinService signing key, so that the approver
			// tells fleetd's tokens from labelled ones others made.
			set.KubeTokens = kube.TokenIssuer{Client: kw.client, Signer: auth.JoinSigner, TTL: cfg.Kubernetes.TokenLifetime.Duration}
		}
		srv.SetInstall(set)
	} else if cfg.Tinkerbell.Enabled() {
		log.Warn("[tinkerbell] is set but no [render.CLASS] is: this control plane installs no machine, and writes no Tinkerbell object")
	}

	ln := o.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			return fmt.Errorf("listen on %s (listen): %w", cfg.Listen, err)
		}
	}
	var httpSrv *http.Server
	var httpLn net.Listener
	if cfg.HTTPListen != "" {
		raw, err := net.Listen("tcp", cfg.HTTPListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("listen on %s (http_listen): %w", cfg.HTTPListen, err)
		}
		lim, err := srv.LimitListener(raw, "https")
		if err != nil {
			raw.Close()
			ln.Close()
			return err
		}
		// Client certificates are asked for, not required: the
		// well-known document and the metrics are public; the export
		// endpoints take an admin credential.
		tc := srv.TLSConfig()
		tc.NextProtos = []string{"h2", "http/1.1"}
		httpLn = tls.NewListener(lim, tc)
		mux := http.NewServeMux()
		mux.Handle(install.Pattern, releaser.Handler())
		mux.Handle("/", srv.HTTPHandler())
		httpSrv = &http.Server{
			Handler: mux, ConnState: lim.ConnState, MaxHeaderBytes: 16 << 10,
			// The config release asks the kernel whether its response
			// was acknowledged, on the connection this keeps.
			ConnContext: install.ConnContext,
			// The TLS handshake and the request's headers must arrive
			// within the handshake timeout; an idle connection closes.
			ReadHeaderTimeout: limits.HandshakeTimeout, IdleTimeout: limits.IdleTimeout,
		}
	}

	var debugSrv *http.Server
	if cfg.DebugListen != "" {
		// Loopback only (checked by config): no authentication.
		dln, err := net.Listen("tcp", cfg.DebugListen)
		if err != nil {
			ln.Close()
			if httpLn != nil {
				httpLn.Close()
			}
			return fmt.Errorf("listen on %s (debug_listen): %w", cfg.DebugListen, err)
		}
		debugSrv = &http.Server{Handler: debugserver.Handler(), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 8 << 10}
		go func() { _ = debugSrv.Serve(dln) }()
		log.WarnContext(ctx, "debug endpoint listening: memory figures and the profiler, without authentication", "debug_listen", dln.Addr().String())
		defer debugSrv.Close()
	}

	serveCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 2)
	running := 1
	go func() { errc <- srv.Serve(serveCtx, ln) }()
	httpAddr := ""
	if httpSrv != nil {
		running++
		httpAddr = httpLn.Addr().String()
		go func() {
			err := httpSrv.Serve(httpLn)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			errc <- err
		}()
	}
	if spire != nil {
		running++
		go func() { spire.Loop(serveCtx); errc <- nil }()
	}
	running++
	go func() { releaser.Run(serveCtx); errc <- nil }()
	if kw != nil {
		kw.retirer.register(srv.MetricsRegistry())
		am := newApproverMetrics(srv.MetricsRegistry())
		klog := log.With("component", "kubernetes")
		running += 2
		// LoadAuthority checked the JoinService signing key is ECDSA P-256.
		joinPub, _ := auth.JoinSigner.Public().(*ecdsa.PublicKey)
		go func() { runApprover(serveCtx, kube.NewApprover(kw.client, joinPub), am, klog); errc <- nil }()
		go func() { kw.retirer.Loop(serveCtx); errc <- nil }()
		log.InfoContext(ctx, "Kubernetes actions on", "kubeconfig", cfg.Resolve(cfg.Kubernetes.Kubeconfig), "cordon", kw.cordoner != nil,
			"token_lifetime", cfg.Kubernetes.TokenLifetime.Duration, "drain_timeout", cfg.Kubernetes.DrainTimeout.Duration)
	}
	log.InfoContext(ctx, "fleetd serving", "grpc", ln.Addr().String(), "https", httpAddr, "trust_domain", auth.TrustDomain, "store", cfg.Store.Driver)
	if o.Ready != nil {
		o.Ready(ln.Addr().String(), httpAddr)
	}

	var firstErr error
	select {
	case <-ctx.Done():
	case firstErr = <-errc:
		running--
	}
	// Stop both servers and wait for them, so the store closes last.
	stop()
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = httpSrv.Shutdown(sctx)
		cancel()
	}
	for ; running > 0; running-- {
		if err := <-errc; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	log.Info("fleetd stopped")
	return firstErr
}

// logTokenChange says, once per change, that a PKCS#11 token stopped
// answering or answers again.
func logTokenChange(log *slog.Logger, ev pkcs11key.Event) {
	if ev.Available {
		log.Warn("PKCS#11 token answers again: joins and renewals are signed again", logkey.PKCS11Token, ev.Token, logkey.PKCS11Module, ev.Module)
		return
	}
	log.Error("PKCS#11 token unavailable: joins and renewals fail with UNAVAILABLE until it returns; reconnect or restore the token, fleetd reconnects by itself",
		logkey.PKCS11Token, ev.Token, logkey.PKCS11Module, ev.Module, logkey.Error, ev.Err)
}

// ekVerifier builds the EK certificate verifier from tpm.ek_roots and
// tpm.ek_roots_dir, or nil when neither is configured.
func ekVerifier(cfg *config.Fleetd) (*attest.Verifier, error) {
	if len(cfg.TPM.EKRoots) == 0 && cfg.TPM.EKRootsDir == "" {
		return nil, nil
	}
	roots, err := certPool(cfg, "tpm.ek_roots", cfg.TPM.EKRoots)
	if err != nil {
		return nil, err
	}
	inter, err := certPool(cfg, "tpm.ek_intermediates", cfg.TPM.EKIntermediates)
	if err != nil {
		return nil, err
	}
	if cfg.TPM.EKRootsDir != "" {
		dir := cfg.Resolve(cfg.TPM.EKRootsDir)
		b, err := ekroots.Load(dir, time.Now())
		if err != nil {
			return nil, fmt.Errorf("tpm.ek_roots_dir: %w", err)
		}
		if b.HasErrors() {
			return nil, fmt.Errorf("tpm.ek_roots_dir: the bundle %s has errors (fleetd ek-roots check %s says more): %w", dir, dir, b.Errors())
		}
		for _, e := range b.Entries {
			switch e.Kind {
			case ekroots.Root:
				roots.AddCert(e.Cert)
			case ekroots.Intermediate:
				inter.AddCert(e.Cert)
			}
		}
	}
	return attest.New(attest.Config{Roots: roots, Intermediates: inter})
}

func certPool(cfg *config.Fleetd, setting string, files []string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	for _, f := range files {
		certs, err := pki.ReadCerts(cfg.Resolve(f))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", setting, err)
		}
		for _, c := range certs {
			pool.AddCert(c)
		}
	}
	return pool, nil
}

// netboxSource is the NetBox inventory source of [inventory.netbox].
func netboxSource(cfg *config.Fleetd) (inventory.Source, error) {
	nb := cfg.Inventory.NetBox
	token, err := os.ReadFile(cfg.Resolve(nb.TokenFile))
	if err != nil {
		return nil, fmt.Errorf("inventory.netbox.token_file: %w", err)
	}
	var roots *x509.CertPool
	if nb.CAFile != "" {
		if roots, err = certPool(cfg, "inventory.netbox.ca_file", []string{nb.CAFile}); err != nil {
			return nil, err
		}
	}
	src, err := netbox.New(netbox.Config{URL: nb.URL, Token: strings.TrimSpace(string(token)), DeclarerUser: nb.DeclarerUser,
		RootCAs: roots, Timeout: nb.Timeout.Duration})
	if err != nil {
		return nil, fmt.Errorf("inventory.netbox: %w", err)
	}
	return src, nil
}

// fdReserve is the open files fleetd keeps apart from its listeners' share
// of the open-file limit: the store, logs, the listeners themselves.
const fdReserve = 256

// connectionLimits turns [limits] into the server's limits, checked
// against the open-file limit nofile (0: unknown): the two listeners'
// connections and fdReserve must fit. A max_connections left unset is
// lowered to fit; one that was set and does not fit is an error.
func connectionLimits(cfg *config.Fleetd, nofile uint64, log *slog.Logger) (service.Limits, error) {
	c := cfg.Limits
	l := service.Limits{
		MaxConns: c.MaxConnections, MaxConnsPerSource: c.MaxConnectionsPerSource, MaxHandshakes: c.MaxHandshakes,
		HTTPMaxConns: c.HTTPMaxConnections, HandshakeTimeout: c.HandshakeTimeout.Duration, IdleTimeout: c.IdleTimeout.Duration,
		KeepaliveTime: c.KeepaliveTime.Duration, KeepaliveTimeout: c.KeepaliveTimeout.Duration,
		RefusalLogBurst: c.RefusalLogBurst, RefusalLogWindow: c.RefusalLogWindow.Duration, RefusalAuditWindow: c.RefusalAuditWindow.Duration,
	}
	d := service.DefaultLimits
	if l.MaxConns == 0 {
		l.MaxConns = d.MaxConns
	}
	if l.HTTPMaxConns == 0 {
		l.HTTPMaxConns = d.HTTPMaxConns
	}
	l.HTTPMaxConns = min(l.HTTPMaxConns, l.MaxConns)
	httpShare := 0
	if cfg.HTTPListen != "" {
		httpShare = l.HTTPMaxConns
	}
	if nofile == 0 || uint64(l.MaxConns+httpShare+fdReserve) <= nofile {
		return l, nil
	}
	if c.MaxConnections != 0 {
		return l, fmt.Errorf("limits.max_connections: %d connections (and %d HTTPS, %d reserved) do not fit the open-file limit of %d: raise it (LimitNOFILE= in the systemd unit, ulimit -n) or lower max_connections",
			l.MaxConns, httpShare, fdReserve, nofile)
	}
	if nofile < 2*fdReserve {
		return l, fmt.Errorf("the open-file limit of %d leaves no room for connections: raise it (LimitNOFILE= in the systemd unit, ulimit -n) to at least %d", nofile, 4*fdReserve)
	}
	room := int(nofile) - fdReserve
	if httpShare > 0 {
		httpShare = min(httpShare, room/8)
		l.HTTPMaxConns = httpShare
	}
	l.MaxConns = room - httpShare
	log.Info("max_connections lowered to fit the open-file limit", "max_connections", l.MaxConns, "http_max_connections", l.HTTPMaxConns, "nofile", nofile)
	return l, nil
}

// serverSafeguards are the export safeguards of fleetd serve's own
// applier: the store's allowances, and runs recorded as fleetd's.
type serverSafeguards struct{ s *service.Server }

func (g serverSafeguards) Allowed(ctx context.Context, digest string) (bool, error) {
	return g.s.ExportAllowed(ctx, digest)
}

func (g serverSafeguards) Record(ctx context.Context, r export.Run) error {
	return g.s.RecordExportRun(ctx, "fleetd", r)
}

// bootWiring is what [boot_policy] and [actuator] make.
type bootWiring struct {
	policies *bootpolicy.Policies
	log      *bootpolicy.VerdictLog
	actuator actuator.Actuator
}

// openBootPolicy loads the boot policies when [boot_policy] names a
// directory, failing closed: an unreadable directory or file, a class a
// declaration may name (or the default worker, or a control-plane class)
// without a policy, or a policy for a class no declaration may name (a
// mistyped class) stops fleetd with a message naming it. It opens
// verdicts.jsonl in data_dir and the actuator. Without [boot_policy] a tpm
// join only checks that the event log replays, and there are no boot
// checks.
func openBootPolicy(cfg *config.Fleetd, dataDir string, log *slog.Logger) (bootWiring, error) {
	var w bootWiring
	if cfg.Actuator.WebhookURL != "" {
		a, err := actuator.NewWebhook(actuator.WebhookConfig{URL: cfg.Actuator.WebhookURL, Timeout: cfg.Actuator.WebhookTimeout.Duration})
		if err != nil {
			return w, fmt.Errorf("actuator.webhook_url: %w", err)
		}
		w.actuator = a
	}
	if cfg.BootPolicy.Dir == "" {
		log.Info("no [boot_policy] dir: tpm joins check only that the event log replays; no boot checks (docs/boot-policy.md)")
		return w, nil
	}
	dir := cfg.Resolve(cfg.BootPolicy.Dir)
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
	if err != nil {
		return w, fmt.Errorf("boot_policy.dir %s: %w; fix the policy files (fleetd policy check tests one) or remove [boot_policy] dir", dir, err)
	}
	classes := cfg.Inventory.Classes
	if len(classes) == 0 {
		classes = lifecycle.DefaultClasses
	}
	need := append([]string{service.DefaultClass}, classes...)
	need = append(need, cfg.BootPolicy.ControlPlaneClasses...)
	if cfg.Intake.Class != "" {
		need = append(need, cfg.Intake.Class)
	}
	var missing, unknown []string
	for _, c := range need {
		if _, err := ps.Policy(c); err != nil && !slices.Contains(missing, c) {
			missing = append(missing, c)
		}
	}
	for _, c := range ps.Classes() {
		if !slices.Contains(need, c) {
			unknown = append(unknown, c)
		}
	}
	if len(missing) > 0 {
		return w, fmt.Errorf("boot_policy.dir %s has no policy for class %s: a machine of a class without a policy could never join; add a policy file for each (docs/boot-policy.md)",
			dir, strings.Join(missing, ", "))
	}
	if len(unknown) > 0 {
		return w, fmt.Errorf("boot_policy.dir %s has a policy for class %s, which no declaration may name (inventory.classes: %s): a mistyped class? rename it or add the class to inventory.classes",
			dir, strings.Join(unknown, ", "), strings.Join(classes, ", "))
	}
	vl, err := bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: dataDir, MaxBytes: cfg.BootPolicy.VerdictLogMaxBytes, Keep: cfg.BootPolicy.VerdictLogKeep})
	if err != nil {
		return w, fmt.Errorf("boot_policy: %w", err)
	}
	w.policies, w.log = ps, vl
	log.Info("boot policy loaded", "dir", dir, "classes", strings.Join(ps.Classes(), ","), "verdict_log", vl.Path())
	return w, nil
}

// controlPlaneRoles are the declared roles any [render.CLASS] renders as a
// control plane (its control_plane_roles, by default "control-plane"), for
// admission: a declaration with one of them is never auto-provisioned.
func controlPlaneRoles(renders map[string]config.Render) []string {
	roles := []string{"control-plane"}
	for _, r := range renders {
		for _, role := range r.ControlPlaneRoles {
			if !slices.Contains(roles, role) {
				roles = append(roles, role)
			}
		}
	}
	return roles
}
