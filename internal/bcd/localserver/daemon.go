package localserver

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/federation"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/bcd/launch"
	"github.com/nodetrust/nodetrust/internal/bcd/leases"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/localapi"
)

// Config configures New.
type Config struct {
	// State is the identity loaded at start; required. Its certificate is
	// the machine certificate. The state is shared with the agent, which
	// owns its key: the daemon signs with it and never closes it. An
	// identity with no roots gives a daemon with no machine certificate.
	State *identity.State
	// DataDir holds credentials/ and run/, and the identity from which a
	// renewed certificate is read. Required.
	DataDir string
	// Socket is the local API's unix socket; default <DataDir>/run/bcd.sock.
	Socket string
	// Namespace is the namespace of calls; default: the trust domain.
	Namespace string
	// FederationListen is host:port of the federation listener; empty
	// means the daemon takes no call of another machine.
	FederationListen string
	// Peers maps node ids to federation addresses, for relayed calls.
	Peers map[string]string
	// Resources are the names of the resources the leases service leases.
	Resources []string
	// LoadKey turns the bytes of node.key into a signer, to read a renewed
	// key; nil means identity.LoadPKCS8Key.
	LoadKey identity.KeyLoader
	// Version is reported by status.
	Version string
	Logger  *slog.Logger
	// Now is the clock of signatures, leases and certificates; nil means
	// time.Now.
	Now func() time.Time
}

// Server is the daemon's local API and federation service.
type Server struct {
	c         Config
	log       *slog.Logger
	nodeID    string
	namespace string
	socket    string

	machine   *federation.Machine
	verifier  *callsig.Verifier
	proofs    *callsig.ProofCache // machine proofs of other machines already verified
	keys      *keyStore
	instances *registry
	leases    *leases.Table
	peers     *peerBook
	relays    *relayPool
	launch    atomic.Pointer[launch.Launch]
	fedAddr   atomic.Pointer[string]

	local *grpc.Server
	fed   *grpc.Server
	once  sync.Once
	// onEnd, when set (by tests), is called after an instance ended.
	onEnd func(name string)
}

// New prepares the daemon: it loads (or at the first start makes) the
// command line's key, makes the boot key and signs the boot statement,
// and clears the instance files of an earlier boot. It does not listen.
func New(cfg Config) (*Server, error) {
	if cfg.State == nil {
		return nil, errors.New("new daemon: no identity")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("new daemon: no data directory")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Namespace == "" {
		cfg.Namespace = cfg.State.Identity.TrustDomain
	}
	if err := localapi.ValidNamespace(cfg.Namespace); err != nil {
		return nil, fmt.Errorf("new daemon: %w; set [local_api] namespace in config.toml", err)
	}
	s := &Server{
		c:         cfg,
		log:       cfg.Logger.With(logkey.Component, "localapi"),
		nodeID:    cfg.State.Identity.NodeID,
		namespace: cfg.Namespace,
		socket:    cfg.Socket,
		keys:      newKeyStore(),
		peers:     newPeerBook(),
		relays:    newRelayPool(),
	}
	layout := datadir.Layout(cfg.DataDir)
	if s.socket == "" {
		s.socket = layout.Socket()
	}
	var err error
	if s.leases, err = leases.New(cfg.Resources, cfg.Now); err != nil {
		return nil, err
	}
	if err := privateDir(layout.Run(), "data_dir"); err != nil {
		return nil, err
	}
	if s.instances, err = newRegistry(layout.Instances()); err != nil {
		return nil, err
	}
	cli, made, err := cliKey(layout.Credentials())
	if err != nil {
		return nil, err
	}
	if made {
		s.log.Info("made the command line's key", "file", layout.CLIKey())
	}
	s.machine, err = federation.New(federation.Config{Namespace: s.namespace, State: cfg.State, Dir: cfg.DataDir, LoadKey: cfg.LoadKey, Now: cfg.Now})
	if err != nil {
		return nil, err
	}
	s.keys.add(localapi.CLISender, cli)
	s.keys.add(localapi.DaemonSender, s.machine.BootPublicKey())
	for sender, key := range map[string]ed25519.PublicKey{localapi.CLISender: cli, localapi.DaemonSender: s.machine.BootPublicKey()} {
		if err := s.machine.Endorse(sender, key); err != nil {
			s.machine.Close()
			return nil, err
		}
	}
	s.proofs = callsig.NewProofCache(0)
	s.verifier, err = callsig.NewVerifier(callsig.VerifierConfig{Namespace: s.namespace, Keys: s.keys, Now: cfg.Now, Start: cfg.Now()})
	if err != nil {
		s.machine.Close()
		return nil, err
	}
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(localapi.MaxMessageLen), grpc.MaxSendMsgSize(localapi.MaxMessageLen)}
	s.local = grpc.NewServer(opts...)
	localv1.RegisterLocalAPIServer(s.local, localAPI{s: s})
	s.fed = grpc.NewServer(append(opts, grpc.Creds(credentials.NewTLS(s.machine.ServerTLS())))...)
	localv1.RegisterFederationServer(s.fed, federationServer{s: s})
	return s, nil
}

// NodeID returns the daemon's node id.
func (s *Server) NodeID() string { return s.nodeID }

// Namespace returns the daemon's namespace.
func (s *Server) Namespace() string { return s.namespace }

// BootID returns the instance id of this boot.
func (s *Server) BootID() string { return s.machine.BootID() }

// Socket returns the local API's socket path.
func (s *Server) Socket() string { return s.socket }

// ServeLocal serves the local API on l until Close.
func (s *Server) ServeLocal(l net.Listener) error { return s.local.Serve(l) }

// ServeFederation serves the federation service on l, over TLS with the
// machine certificate, until Close.
func (s *Server) ServeFederation(l net.Listener) error {
	addr := l.Addr().String()
	s.fedAddr.Store(&addr)
	return s.fed.Serve(l)
}

// Run listens on the socket and, when configured, the federation address,
// and serves until ctx ends or a listener fails. Then it ends every
// instance's start (forgetting its key and removing its files) and closes.
func (s *Server) Run(ctx context.Context) error {
	defer s.Close()
	l, err := listenSocket(s.socket)
	if err != nil {
		return err
	}
	defer os.Remove(s.socket)
	errc := make(chan error, 2)
	go func() { errc <- s.ServeLocal(l) }()
	s.log.InfoContext(ctx, "local API listening", "socket", s.socket, "namespace", s.namespace, "boot_id", s.machine.BootID())
	if s.c.FederationListen != "" {
		if s.machine.Certificate() == nil {
			s.log.WarnContext(ctx, "no machine certificate: this daemon takes no call of another machine", "listen", s.c.FederationListen)
		} else {
			fl, err := net.Listen("tcp", s.c.FederationListen)
			if err != nil {
				return fmt.Errorf("listen for the calls of other machines on %s: %w; change [federation] listen in config.toml", s.c.FederationListen, err)
			}
			go func() { errc <- s.ServeFederation(fl) }()
			s.log.InfoContext(ctx, "federation listening", "addr", fl.Addr().String())
		}
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return fmt.Errorf("serve the local API: %w", err)
	}
}

// Close stops serving, ends the Run streams (each forgets its instance's
// key and removes its files) and releases the node key.
func (s *Server) Close() {
	s.once.Do(func() {
		s.local.Stop()
		s.fed.Stop()
		for _, in := range s.instances.list() {
			s.endInstance(context.Background(), in, "the daemon stopped", 0)
		}
		s.relays.close()
		s.machine.Close()
	})
}

func (s *Server) now() time.Time { return s.c.Now() }
