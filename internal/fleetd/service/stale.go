package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// DefaultStaleAfter is how old a node's last boot verdict may be before
// the node is stale: two missed hourly boot checks and a margin.
const DefaultStaleAfter = 150 * time.Minute

// maxStaleLines bounds the log lines of one sweep about nodes going stale;
// the rest are summed up in one line.
const maxStaleLines = 20

// StaleSweep is what one staleness sweep found.
type StaleSweep struct {
	// Live counts the nodes with a live TPM identity; Stale lists those
	// whose last boot verdict is older than StaleAfter.
	Live  int
	Stale []string
	// Idle: no verdict of any node is younger than StaleAfter (nor is
	// this server's start) while Live > 0: the control plane verifies
	// nothing.
	Idle bool
}

// liveTPM reports whether n holds a live TPM identity whose boots fleetd
// should keep checking: joined with its TPM, running, its certificate
// valid at now.
func liveTPM(n store.Node, now time.Time) bool {
	return n.EKPin != "" && (n.State == store.StateActive || n.State == store.StateProvisioning) && n.CertNotAfter.After(now)
}

// SweepStale finds the nodes whose boot checks stopped arriving: a node
// with a live TPM identity whose newest stored verdict (or its join, or
// this server's start, whichever is later) is older than StaleAfter. It
// sets nodetrust_boot_stale_nodes, logs one line per node going stale
// and one when it is checked again, and changes no state: a missing
// check is not evidence. With no verdict at all for StaleAfter while
// such nodes live, the control plane alerts on itself
// (nodetrust_boot_verifier_idle). The clock is cfg.Now.
func (s *Server) SweepStale(ctx context.Context) (StaleSweep, error) {
	var out StaleSweep
	if s.cfg.BootPolicy == nil {
		return out, nil
	}
	now := s.cfg.Now()
	nodes, err := s.cfg.Store.ListNodes(ctx)
	if err != nil {
		return out, fmt.Errorf("list nodes: %w", err)
	}
	s.stale.mu.Lock()
	prev, wasIdle := s.stale.nodes, s.stale.idle
	s.stale.mu.Unlock()
	// The newest verdict of the fleet, of any replica, from the store.
	newest := s.started
	stale := map[string]bool{}
	type goneStale struct {
		n    store.Node
		last time.Time
	}
	var became []goneStale
	for _, n := range nodes {
		if !liveTPM(n, now) {
			continue
		}
		out.Live++
		last := n.JoinedAt
		vs, err := s.cfg.Store.ListVerdicts(ctx, n.ID, 1)
		if err != nil {
			return out, fmt.Errorf("the verdicts of node %s: %w", n.ID, err)
		}
		if len(vs) == 1 {
			last = later(last, vs[0].Time)
			newest = later(newest, vs[0].Time)
		}
		if now.Sub(later(last, s.started)) <= s.cfg.StaleAfter {
			continue
		}
		out.Stale = append(out.Stale, n.ID)
		stale[n.ID] = true
		if !prev[n.ID] {
			became = append(became, goneStale{n, last})
		}
	}
	out.Idle = out.Live > 0 && now.Sub(newest) > s.cfg.StaleAfter

	s.stale.mu.Lock()
	s.stale.nodes, s.stale.idle = stale, out.Idle
	s.stale.mu.Unlock()

	s.boot.stale.Set(float64(len(out.Stale)))
	idle := 0.0
	if out.Idle {
		idle = 1
	}
	s.boot.idle.Set(idle)
	for i, g := range became {
		if i == maxStaleLines {
			s.log.WarnContext(ctx, "more nodes' boot checks are overdue: see nodetrust_boot_stale_nodes", "more", len(became)-maxStaleLines)
			break
		}
		s.log.WarnContext(ctx, "a node's boot check is overdue: not evidence, its state is unchanged; check its bcd and its session (fleetd nodes show, fleetd nodes check)",
			logkey.NodeID, g.n.ID, "class", classOf(g.n.Class), "last_verdict", g.last.UTC().Format(time.RFC3339), "stale_after", s.cfg.StaleAfter.String())
	}
	resumed := 0
	for id := range prev {
		if !stale[id] {
			if resumed++; resumed <= maxStaleLines {
				s.log.InfoContext(ctx, "a stale node's boot check arrived (or it no longer holds a live TPM identity)", logkey.NodeID, id)
			}
		}
	}
	switch {
	case out.Idle && !wasIdle:
		s.log.ErrorContext(ctx, "ALERT: the control plane stored no boot verdict for longer than stale_after while nodes with a live TPM identity exist: check that nodes reach fleetd and that boot checks run",
			"live_nodes", out.Live, "last_verdict", newest.UTC().Format(time.RFC3339), "stale_after", s.cfg.StaleAfter.String())
	case !out.Idle && wasIdle:
		s.log.InfoContext(ctx, "the control plane stores boot verdicts again")
	}
	return out, nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// staleState is what the last staleness sweep found, so that a node is
// logged once when it goes stale.
type staleState struct {
	mu    sync.Mutex
	nodes map[string]bool
	idle  bool
}

// sweepStaleEvery runs SweepStale every tenth of StaleAfter (at most every
// five minutes) until ctx is done.
func (s *Server) sweepStaleEvery(ctx context.Context) {
	every := min(max(s.cfg.StaleAfter/10, time.Second), 5*time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if _, err := s.SweepStale(ctx); err != nil && ctx.Err() == nil {
				s.log.ErrorContext(ctx, "staleness sweep failed; it runs again", "every", every.String(), logkey.Error, err)
			}
		case <-ctx.Done():
			return
		}
	}
}
