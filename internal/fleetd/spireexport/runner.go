package spireexport

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Runner applies fleetd's own export on an interval inside fleetd serve,
// and at once after a retirement (it is a lifecycle.RetireHook). One run
// at a time.
type Runner struct {
	Applier *Applier
	// Document builds the export (the envelope's bytes).
	Document func(ctx context.Context) ([]byte, error)
	Interval time.Duration
	Log      *slog.Logger
	mu       sync.Mutex
}

// RunOnce builds the export and applies it.
func (r *Runner) RunOnce(ctx context.Context) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	data, err := r.Document(ctx)
	if err != nil {
		return Result{}, err
	}
	return r.Applier.Run(ctx, data, false)
}

// Loop runs the export every Interval until ctx is done.
func (r *Runner) Loop(ctx context.Context) {
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		if _, err := r.RunOnce(ctx); err != nil && !errors.Is(err, ErrHeld) && ctx.Err() == nil && r.Log != nil {
			r.Log.ErrorContext(ctx, "SPIRE export run failed; the next run tries again", "error", err, "interval", r.Interval)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Name names the retirement hook.
func (r *Runner) Name() string { return "spire-export" }

// Retired applies the export at once, so the retired node's entries go
// and its agents are banned (within the safeguards: a held change is
// reported as the hook's error).
func (r *Runner) Retired(ctx context.Context, _ store.Node, _ string) error {
	_, err := r.RunOnce(ctx)
	return err
}
