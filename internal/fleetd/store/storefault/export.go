package storefault

import (
	"context"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// HoldExport implements store.Store.
func (f *Store) HoldExport(ctx context.Context, h store.ExportHold, max int) error {
	if err := f.enter(ctx, "HoldExport"); err != nil {
		return err
	}
	return f.Store.HoldExport(ctx, h, max)
}

// AllowExport implements store.Store.
func (f *Store) AllowExport(ctx context.Context, digest, by string, now time.Time, audit *store.AuditEvent) (store.ExportHold, error) {
	if err := f.enter(ctx, "AllowExport"); err != nil {
		return store.ExportHold{}, err
	}
	return f.Store.AllowExport(ctx, digest, by, now, audit)
}

// GetExportHold implements store.Store.
func (f *Store) GetExportHold(ctx context.Context, digest string) (store.ExportHold, error) {
	if err := f.enter(ctx, "GetExportHold"); err != nil {
		return store.ExportHold{}, err
	}
	return f.Store.GetExportHold(ctx, digest)
}

// ListExportHolds implements store.Store.
func (f *Store) ListExportHolds(ctx context.Context, limit int) ([]store.ExportHold, error) {
	if err := f.enter(ctx, "ListExportHolds"); err != nil {
		return nil, err
	}
	return f.Store.ListExportHolds(ctx, limit)
}

// DeleteJoinCredentials implements store.Store.
func (f *Store) DeleteJoinCredentials(ctx context.Context, nodeID string, audit *store.AuditEvent) (int, int, error) {
	if err := f.enter(ctx, "DeleteJoinCredentials"); err != nil {
		return 0, 0, err
	}
	return f.Store.DeleteJoinCredentials(ctx, nodeID, audit)
}
