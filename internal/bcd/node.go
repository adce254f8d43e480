package bcd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/bcd/journal"
	"github.com/nodetrust/nodetrust/internal/bcd/localserver"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// NodeOptions is what RunNode needs besides config.toml.
type NodeOptions struct {
	Config  *config.BCD
	Logger  *slog.Logger
	Version string
	// ClaimsRoot is the folder tree hardware claims are read from; empty
	// means the host's own (a development knob lets tests run many nodes
	// on one machine).
	ClaimsRoot string
	// CrashAfter names a renewal storage step (identity.StepNextKey,
	// StepIdentity, StepPromote) after which the process kills itself
	// with SIGKILL: a development knob for crash-safety tests.
	CrashAfter string
}

// RunNode runs bcd node until ctx ends (nil), the certificate is revoked
// (an error wrapping agent.ErrRevoked) or refused (agent.ErrRefused), or a
// part fails. It opens the TPM (or bcd helper) and the journal once, loads
// the identity once, and runs the agent, the local API and the federation
// listener on that one identity: the agent owns its key and the federation
// credentials read each renewal from the data directory.
func RunNode(ctx context.Context, o NodeOptions) error {
	cfg, log := o.Config, o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t, closeTPM, err := OpenTPM(cfg.TPM, cfg.HelperSocket(), false, func(msg string) { log.Warn(msg) })
	if err != nil {
		return err
	}
	defer closeTPM()
	j, err := journal.Open(cfg.DataDir, time.Now)
	if err != nil {
		return fmt.Errorf("open the journal: %w", err)
	}
	defer j.Close()
	if j.Recovered() {
		log.Warn("the journal was unreadable and starts over; the identity is kept", logkey.JournalID, j.ID())
	}
	keys := agent.Keys{TPM: t}
	st, err := identity.LoadState(cfg.DataDir, identity.LoadOptions{KeyLoader: keys.Loader(ctx)})
	if err != nil {
		return err
	}

	resources := cfg.Leases.Resources
	if resources == nil {
		for i := range hwclaims.Read(o.ClaimsRoot).GPUUUIDs {
			resources = append(resources, fmt.Sprintf("gpu%d", i))
		}
	}
	d, err := localserver.New(localserver.Config{
		State:            st,
		DataDir:          cfg.DataDir,
		Socket:           cfg.SocketPath(),
		Namespace:        cfg.LocalAPI.Namespace,
		FederationListen: cfg.Federation.Listen,
		Peers:            cfg.Federation.Peers,
		Resources:        resources,
		LoadKey:          keys.Loader(ctx),
		Version:          o.Version,
		Logger:           log,
	})
	if err != nil {
		return fmt.Errorf("start the local API: %w", err)
	}

	nc := agent.NodeConfig{
		Servers:       cfg.Addresses(),
		ServerName:    cfg.ServerName,
		Pins:          cfg.Pins,
		DataDir:       cfg.DataDir,
		Version:       o.Version,
		Logger:        log,
		Journal:       j,
		State:         st,
		TPM:           t,
		RenewFraction: cfg.Renewal.Fraction,
		BackoffMin:    cfg.Renewal.BackoffMin.Duration,
		BackoffMax:    cfg.Renewal.BackoffMax.Duration,

		SessionTransport: cfg.SessionTransport,

		BootCheckInterval: cfg.BootCheck.Interval.Duration,
		EventLogPath:      cfg.BootCheck.EventLog,
		// A TPM over TCP (swtpm) measured no boot of this host: send the
		// host's log only when one is configured.
		NoEventLog: cfg.BootCheck.EventLog == "" && strings.HasPrefix(cfg.TPM, "tcp://"),
		// The daemon refuses the calls of other machines made with a
		// revoked certificate, cached proof or not.
		PeerRevoked: d.PeerCertRevoked,
	}
	if o.CrashAfter != "" {
		nc.AfterStore = func(step string) {
			if step == o.CrashAfter {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
	}

	// The local API and the agent run together: either ending ends both.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	derr := make(chan error, 1)
	go func() {
		derr <- d.Run(ctx)
		stop()
	}()
	err = agent.RunNode(ctx, nc)
	stop()
	if e := <-derr; e != nil && err == nil {
		err = e
	}
	return err
}
