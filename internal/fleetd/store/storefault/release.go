package storefault

import (
	"context"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// PutConfigRelease implements store.Store.
func (f *Store) PutConfigRelease(ctx context.Context, r store.ConfigRelease, audit *store.AuditEvent) (store.ConfigRelease, error) {
	if err := f.enter(ctx, "PutConfigRelease"); err != nil {
		return store.ConfigRelease{}, err
	}
	return f.Store.PutConfigRelease(ctx, r, audit)
}

// GetConfigRelease implements store.Store.
func (f *Store) GetConfigRelease(ctx context.Context, uuid string) (store.ConfigRelease, error) {
	if err := f.enter(ctx, "GetConfigRelease"); err != nil {
		return store.ConfigRelease{}, err
	}
	return f.Store.GetConfigRelease(ctx, uuid)
}

// ClaimConfigRelease implements store.Store.
func (f *Store) ClaimConfigRelease(ctx context.Context, uuid string, generation uint64, claim string, now, until time.Time) error {
	if err := f.enter(ctx, "ClaimConfigRelease"); err != nil {
		return err
	}
	return f.Store.ClaimConfigRelease(ctx, uuid, generation, claim, now, until)
}

// UnclaimConfigRelease implements store.Store.
func (f *Store) UnclaimConfigRelease(ctx context.Context, uuid string, generation uint64, claim string) error {
	if err := f.enter(ctx, "UnclaimConfigRelease"); err != nil {
		return err
	}
	return f.Store.UnclaimConfigRelease(ctx, uuid, generation, claim)
}

// BurnConfigRelease implements store.Store.
func (f *Store) BurnConfigRelease(ctx context.Context, uuid string, generation uint64, claim string, now time.Time) error {
	if err := f.enter(ctx, "BurnConfigRelease"); err != nil {
		return err
	}
	return f.Store.BurnConfigRelease(ctx, uuid, generation, claim, now)
}

// ListUnsettledReleases implements store.Store.
func (f *Store) ListUnsettledReleases(ctx context.Context, limit int) ([]store.ConfigRelease, error) {
	if err := f.enter(ctx, "ListUnsettledReleases"); err != nil {
		return nil, err
	}
	return f.Store.ListUnsettledReleases(ctx, limit)
}

// SettleActivation implements store.Store.
func (f *Store) SettleActivation(ctx context.Context, uuid string, generation uint64, outcome string, now time.Time) error {
	if err := f.enter(ctx, "SettleActivation"); err != nil {
		return err
	}
	return f.Store.SettleActivation(ctx, uuid, generation, outcome, now)
}

// FailActivation implements store.Store.
func (f *Store) FailActivation(ctx context.Context, uuid string, generation uint64, reason string) error {
	if err := f.enter(ctx, "FailActivation"); err != nil {
		return err
	}
	return f.Store.FailActivation(ctx, uuid, generation, reason)
}

// PurgeExpiredReleases implements store.Store.
func (f *Store) PurgeExpiredReleases(ctx context.Context, now time.Time) (int, error) {
	if err := f.enter(ctx, "PurgeExpiredReleases"); err != nil {
		return 0, err
	}
	return f.Store.PurgeExpiredReleases(ctx, now)
}
