package service

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/actuator"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/connlimit"
	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/throttle"
	"github.com/nodetrust/nodetrust/pki"
)

// Config is what a Server needs. New fills in the defaults.
type Config struct {
	Authority *pki.Authority
	Store     store.Store
	Logger    *slog.Logger
	// NodeCertLifetime is the lifetime of issued node certificates.
	NodeCertLifetime time.Duration
	// TokenTTL is the default token lifetime; MaxTokenTTL the longest an
	// admin may ask for.
	TokenTTL    time.Duration
	MaxTokenTTL time.Duration
	// RenewalLimit renewals per node are allowed in any RenewalWindow
	// (default 6 per hour); more are answered RESOURCE_EXHAUSTED with a
	// pushback.
	RenewalLimit  int
	RenewalWindow time.Duration
	// RamdiskRoles are roles whose certificates live at most two hours.
	RamdiskRoles []string
	// PendingPoll is how often a node waiting for approval asks again.
	PendingPoll time.Duration
	// EKVerifier checks EK certificates against the TPM manufacturers'
	// roots; nil trusts no EK certificate, so only EKs already pinned for
	// a node can join with the tpm attestor.
	EKVerifier *attest.Verifier
	// RequireEKCertificateAndPin refuses a tpm join unless its EK
	// certificate is trusted and its EK is known too (pinned for a node,
	// or bound by a declaration): neither proof stands in for the other.
	RequireEKCertificateAndPin bool
	// ChallengeTTL is how long a tpm join's challenge round may be
	// answered (default 1 minute).
	ChallengeTTL time.Duration
	// ProbeTimeout is how long an older session of a node may take to
	// answer a probe before a new process's session replaces it.
	ProbeTimeout time.Duration
	// Inventory is where declarations come from; default the store's
	// (fleetd inventory apply).
	Inventory inventory.Source
	// InventoryClasses are the classes a declaration may name (default
	// lifecycle.DefaultClasses).
	InventoryClasses []string
	// InventoryRequired makes every join of an undeclared machine wait as
	// a claim; AutoProvision lets a planned worker's first TPM join start
	// its installation.
	InventoryRequired bool
	AutoProvision     bool
	// MaxClaims bounds the claims kept (default 10000).
	MaxClaims int
	// RetireHooks run after each retirement.
	RetireHooks []lifecycle.RetireHook
	// ReleaseHooks run after each release of a quarantine.
	ReleaseHooks []lifecycle.ReleaseHook
	// ExportEligibleStates are the node states the SPIRE export lists as
	// eligible (default export.DefaultEligibleStates: active).
	ExportEligibleStates []string
	// AdvertiseAddresses are the replicas' gRPC addresses the well-known
	// document names, for nodes to move between.
	AdvertiseAddresses []string
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Limits bound what hostile traffic costs; zero fields take
	// DefaultLimits'.
	Limits Limits

	// BootPolicy, when set, judges every boot a TPM proves: tpm joins
	// (intake), renewals of certificates that name an AK, and boot checks
	// on the live session (docs/boot-policy.md). Nil keeps a tpm join's
	// check to the event log's replay, and boot checks off.
	BootPolicy *bootpolicy.Policies
	// VerdictLog, when set, receives every verdict (verdicts.jsonl).
	VerdictLog *bootpolicy.VerdictLog
	// VerdictsKept is how many verdicts the store keeps per node (default
	// DefaultVerdictsKept).
	VerdictsKept int
	// ControlPlaneClasses are the classes whose failed verdicts only
	// alert (default control-plane); a failed verdict of any other class
	// quarantines the node.
	ControlPlaneClasses []string
	// Actuator, when set, is asked to cordon a node quarantined by its
	// boot policy.
	Actuator actuator.Actuator
	// BootCheckTimeout is how long a node has to answer a nonce with its
	// evidence (default 1 minute); no answer is not evidence.
	BootCheckTimeout time.Duration
	// StaleAfter is how old a node's last boot verdict may be before the
	// node is stale, and how long the control plane may store none while
	// TPM nodes live before it alerts on itself (default
	// DefaultStaleAfter). Only with BootPolicy.
	StaleAfter time.Duration
	// IntakeClass is the class whose boot policy judges an intake: the
	// install environment's (default lifecycle.ClassInstallEnvironment).
	IntakeClass string
	// IntakeWindow is how long an intake's LDevID, LAK certificate and
	// session last: the install window (default DefaultIntakeWindow).
	IntakeWindow time.Duration
	// KeyExchanges are the TLS key exchanges offered, in order; nil means
	// Go's default (the hybrid X25519MLKEM768 first).
	KeyExchanges []tls.CurveID
}

// Server holds the control plane's services.
type Server struct {
	cfg      Config
	metrics  *metrics
	boot     *bootMetrics
	sessions *sessions
	gateway  *gateway
	framed   framedConns
	// revfeed holds the sessions subscribed to the revocation feed.
	revfeed   *revFeed
	log       *slog.Logger
	wellKnown []byte
	clientCAs *x509.CertPool
	// replica names this process among the replicas that share a store.
	replica string
	// probes are the answers awaited from other replicas, by probe id.
	probeMu   sync.Mutex
	probes    map[string]chan string
	admission *lifecycle.Admission
	lifecycle *lifecycle.Manager
	// logThrottle bounds refusal log lines per reason and source;
	// auditThrottle refusal audit records per reason and token.
	logThrottle   *throttle.Limiter
	auditThrottle *throttle.Limiter
	// methods are the full names of the methods served.
	methods map[string]struct{}
	// exportMetrics count the SPIRE export's runs.
	exportMetrics *exportMetrics
	// started is when New ran (cfg.Now); stale is the last staleness
	// sweep's findings.
	started time.Time
	stale   staleState
	// install holds the Install RPC's settings (SetInstall).
	install installState
	// overLimit remembers the nodes refused as over the renewal limit.
	overLimit overLimitMemo
}

// New checks cfg and builds a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Authority == nil || cfg.Store == nil {
		return nil, errors.New("server: Authority and Store are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.NodeCertLifetime <= 0 {
		cfg.NodeCertLifetime = 24 * time.Hour
	}
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = time.Hour
	}
	if cfg.MaxTokenTTL <= 0 {
		cfg.MaxTokenTTL = 30 * 24 * time.Hour
	}
	if cfg.RenewalLimit <= 0 {
		cfg.RenewalLimit = 6
	}
	if cfg.RenewalWindow <= 0 {
		cfg.RenewalWindow = time.Hour
	}
	if cfg.RamdiskRoles == nil {
		cfg.RamdiskRoles = []string{"ramdisk"}
	}
	if cfg.PendingPoll <= 0 {
		cfg.PendingPoll = 2 * time.Second
	}
	if cfg.ChallengeTTL <= 0 {
		cfg.ChallengeTTL = time.Minute
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 3 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Inventory == nil {
		cfg.Inventory = inventory.StoreSource{Store: cfg.Store}
	}
	if cfg.InventoryClasses == nil {
		cfg.InventoryClasses = lifecycle.DefaultClasses
	}
	if cfg.MaxClaims <= 0 {
		cfg.MaxClaims = 10000
	}
	if cfg.VerdictsKept <= 0 {
		cfg.VerdictsKept = DefaultVerdictsKept
	}
	if cfg.ControlPlaneClasses == nil {
		cfg.ControlPlaneClasses = []string{"control-plane"}
	}
	if cfg.BootCheckTimeout <= 0 {
		cfg.BootCheckTimeout = time.Minute
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = DefaultStaleAfter
	}
	if cfg.IntakeClass == "" {
		cfg.IntakeClass = lifecycle.ClassInstallEnvironment
	}
	if cfg.IntakeWindow <= 0 {
		cfg.IntakeWindow = DefaultIntakeWindow
	}
	if ps := cfg.BootPolicy; ps != nil {
		for _, c := range ps.Classes() {
			if p, err := ps.Policy(c); err == nil && p.QuarantineAfter > cfg.VerdictsKept {
				return nil, fmt.Errorf("the %s boot policy quarantines after %d failed verdicts in a row, but the store keeps %d per node: raise [boot_policy] verdicts_kept or lower [response] quarantine_after in %s",
					c, p.QuarantineAfter, cfg.VerdictsKept, p.File)
			}
		}
	}
	cfg.Limits.applyDefaults()
	logThrottle, err := throttle.New(throttle.Config{Window: cfg.Limits.RefusalLogWindow, Burst: cfg.Limits.RefusalLogBurst, Now: cfg.Now})
	if err != nil {
		return nil, err
	}
	auditThrottle, err := throttle.New(throttle.Config{Window: cfg.Limits.RefusalAuditWindow, Burst: 1, Now: cfg.Now})
	if err != nil {
		return nil, err
	}
	doc, err := WellKnownDocument(cfg.Authority, cfg.AdvertiseAddresses)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cfg.Authority.ServingCA)
	pool.AddCert(cfg.Authority.NodeCA)
	if cfg.Authority.AdminCA != nil {
		pool.AddCert(cfg.Authority.AdminCA)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, wellKnown: doc, clientCAs: pool, sessions: newSessions(), revfeed: newRevFeed(),
		logThrottle: logThrottle, auditThrottle: auditThrottle, methods: map[string]struct{}{},
		replica: randomHex(8), probes: map[string]chan string{}, started: cfg.Now()}
	s.revfeed.drain = s.drainRevocations
	s.gateway = &gateway{s: s}
	for _, sd := range []grpc.ServiceDesc{joinv1.JoinService_ServiceDesc, adminv1.Admin_ServiceDesc, gatewayv1.Gateway_ServiceDesc} {
		for _, m := range sd.Methods {
			s.methods["/"+sd.ServiceName+"/"+m.MethodName] = struct{}{}
		}
		for _, m := range sd.Streams {
			s.methods["/"+sd.ServiceName+"/"+m.StreamName] = struct{}{}
		}
	}
	s.metrics = newMetrics(s)
	s.boot = newBootMetrics(s.metrics.reg)
	s.exportMetrics = newExportMetrics(s.metrics.reg)
	s.announceModes()
	s.admission = &lifecycle.Admission{Store: cfg.Store, Source: cfg.Inventory, Required: cfg.InventoryRequired, AutoProvision: cfg.AutoProvision}
	s.lifecycle = &lifecycle.Manager{Store: cfg.Store, Source: cfg.Inventory, TrustDomain: cfg.Authority.TrustDomain, Hooks: cfg.RetireHooks, ReleaseHooks: cfg.ReleaseHooks, Now: cfg.Now,
		Revoked: func(nodeID, reason string, gen uint64) bool {
			s.metrics.revocation("retire")
			s.publishRevocation(context.Background(), nodeID, false)
			return s.sessions.notify(nodeID, &gatewayv1.RevocationNotice{Reason: reason, IdentityGeneration: gen})
		}}
	return s, nil
}

// Lifecycle is the server's lifecycle manager: other parts of fleetd (the
// boot-policy checks) quarantine and release nodes through it, so their
// changes are audited and reach live sessions like an admin's.
func (s *Server) Lifecycle() *lifecycle.Manager { return s.lifecycle }

// TLSConfig is the serving TLS configuration: the serving certificate, and
// client certificates verified when given (admins chain to the admin CA,
// nodes to the node CA; each service checks which it needs).
func (s *Server) TLSConfig() *tls.Config {
	cert := s.cfg.Authority.ServingCert
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    s.clientCAs,
		// h2 for gRPC; the framed session for nodes that ask for it
		// (framed.go).
		NextProtos: []string{"h2", sessionframe.ALPN},
		// nil: Go's default.
		CurvePreferences: s.cfg.KeyExchanges,
	}
}

// GRPCServer builds the gRPC server with every service registered, for
// connections from lim (which learns of their handshakes and streams).
func (s *Server) GRPCServer(lim *connlimit.Listener) *grpc.Server {
	l := s.cfg.Limits
	g := grpc.NewServer(
		grpc.Creds(lim.Credentials(s.framedCredentials(credentials.NewTLS(s.TLSConfig())))),
		grpc.StatsHandler(lim.StatsHandler()),
		grpc.StatsHandler(sizeStats{s}),
		// Handlers return errors; wireError is the one place they
		// become wire codes.
		grpc.ChainUnaryInterceptor(s.unaryErrors, s.limitUnary, s.authorizeAdmin),
		grpc.ChainStreamInterceptor(s.streamErrors, s.limitStream),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Find connections of nodes that vanished (a reboot sends no FIN),
		// and close those that carry no stream.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: l.KeepaliveTime, Timeout: l.KeepaliveTimeout, MaxConnectionIdle: l.IdleTimeout}),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.MaxRecvMsgSize(maxJoinBytes),
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		// No 32 KiB read buffer per connection: the framer reads from the
		// TLS connection, which buffers a record already. A held session
		// is idle almost always, so the buffer was memory for nothing;
		// 4 KiB and 32 KiB buffers measured no better revocation latency
		// (docs/performance.md, issue 20 part 2). Writes share pooled
		// buffers (grpc-go's default).
		grpc.ReadBufferSize(0),
	)
	joinv1.RegisterJoinServiceServer(g, &joinService{s: s})
	adminv1.RegisterAdminServer(g, &adminService{s: s})
	gatewayv1.RegisterGatewayServer(g, s.gateway)
	return g
}

// Serve serves gRPC on ln, within the server's connection limits, until
// ctx is done, then stops gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	lim, err := s.LimitListener(ln, "grpc")
	if err != nil {
		return err
	}
	g := s.GRPCServer(lim)
	sumCtx, stopSummaries := context.WithCancel(ctx)
	summaries := make(chan struct{})
	go func() { s.summarizeEvery(sumCtx); close(summaries) }()
	defer func() { stopSummaries(); <-summaries }()
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); s.watchRevocations(watchCtx) }()
	defer func() { stopWatch(); <-watched }()
	if s.cfg.BootPolicy != nil {
		sweepCtx, stopSweep := context.WithCancel(ctx)
		swept := make(chan struct{})
		go func() { defer close(swept); s.sweepStaleEvery(sweepCtx) }()
		defer func() { stopSweep(); <-swept }()
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			// Live sessions never end by themselves: end them, so the
			// graceful stop waits only for calls in flight.
			s.sessions.closeAll()
			stopped := make(chan struct{})
			go func() { g.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				g.Stop()
			}
		case <-done:
		}
	}()
	err = g.Serve(lim)
	close(done)
	// gRPC let go of the framed sessions' connections: wait for them.
	s.framed.shutdown(5 * time.Second)
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve gRPC on %s: %w", ln.Addr(), err)
	}
	return nil
}
