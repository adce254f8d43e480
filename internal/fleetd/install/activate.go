package install

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Activate is the lifecycle step a config release takes: a provisioning
// node becomes active. It is no admin action: only a delivered config
// takes it.
var Activate = lifecycle.Transition{Name: "activate", From: []string{store.StateProvisioning}, To: store.StateActive, Action: roles.Lifecycle}

// Outcomes of an activation, stored when it is settled.
const (
	ActivationActive = "active"
)

// sweepBatch bounds the releases one sweep activates.
const sweepBatch = 100

// LifecycleActivator activates through the lifecycle manager: one
// transaction that checks the node is provisioning, writes active, appends
// the history and the audit trail.
type LifecycleActivator struct {
	Manager *lifecycle.Manager
}

// Activate implements Activator. A node already active is settled as
// active; one in another state (quarantined, retired meanwhile), or gone,
// is settled as not activated: retrying would not change it.
func (a LifecycleActivator) Activate(ctx context.Context, nodeID, reason string) (string, error) {
	// A declared device without a node record would be written by the
	// manager as it transitions; a release never makes one.
	if _, err := a.Manager.Store.GetNode(ctx, nodeID); errors.Is(err, store.ErrNotFound) {
		return "not activated: no node record " + nodeID, nil
	} else if err != nil {
		return "", fmt.Errorf("look up node %s: %w", nodeID, err)
	}
	_, err := a.Manager.Do(ctx, Activate, nodeID, "install", reason, "")
	var se *lifecycle.StateError
	switch {
	case err == nil:
		return ActivationActive, nil
	case errors.As(err, &se) && se.State == store.StateActive:
		return ActivationActive, nil
	case errors.As(err, &se):
		return "not activated: node is " + se.State, nil
	case errors.Is(err, lifecycle.ErrUnknown):
		return "not activated: no node record " + nodeID, nil
	}
	return "", err
}

// Sweep settles the activations of delivered configs that are not
// settled yet (a failed state update is retried here, not lost), and drops
// the sealed configs that expired. It returns how many activations it
// settled.
func (r *Releaser) Sweep(ctx context.Context) (int, error) {
	now := r.cfg.Now()
	var errs []error
	if n, err := r.cfg.Store.PurgeExpiredReleases(ctx, now); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		r.log.InfoContext(ctx, "expired configs dropped: their codes can no longer fetch them", "configs", n)
	}
	rels, err := r.cfg.Store.ListUnsettledReleases(ctx, sweepBatch)
	if err != nil {
		return 0, errors.Join(append(errs, err)...)
	}
	settled := 0
	for _, rel := range rels {
		reason := fmt.Sprintf("config of machine %s (render %d) released", rel.UUID, rel.Generation)
		outcome, err := r.cfg.Activator.Activate(ctx, rel.NodeID, reason)
		if err != nil {
			r.metrics.activations.WithLabelValues("retry").Inc()
			msg := err.Error()
			if len(msg) > 512 {
				msg = msg[:512] + "…"
			}
			if ferr := r.cfg.Store.FailActivation(ctx, rel.UUID, rel.Generation, msg); ferr != nil && !errors.Is(ferr, store.ErrConflict) {
				errs = append(errs, ferr)
			}
			r.log.WarnContext(ctx, "node not activated after its config release: retried at the next sweep", "node", rel.NodeID, "uuid", rel.UUID,
				"attempts", rel.ActivationAttempts+1, "error", err)
			continue
		}
		if err := r.cfg.Store.SettleActivation(ctx, rel.UUID, rel.Generation, outcome, r.cfg.Now()); err != nil {
			if !errors.Is(err, store.ErrConflict) {
				// The node changed; the settlement is written at the
				// next sweep (activating again is harmless).
				errs = append(errs, err)
			}
			continue
		}
		settled++
		if outcome == ActivationActive {
			r.metrics.activations.WithLabelValues("active").Inc()
			r.log.InfoContext(ctx, "node active after its config release", "node", rel.NodeID, "uuid", rel.UUID)
		} else {
			r.metrics.activations.WithLabelValues("refused").Inc()
			r.log.WarnContext(ctx, "config released, node not made active", "node", rel.NodeID, "uuid", rel.UUID, "outcome", outcome)
		}
	}
	return settled, errors.Join(errs...)
}

// Run sweeps every SweepEvery, and at once after each release, until ctx
// ends.
func (r *Releaser) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.SweepEvery)
	defer t.Stop()
	for {
		if _, err := r.Sweep(ctx); err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "config release sweep failed: retried at the next sweep", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
		}
	}
}
