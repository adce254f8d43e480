package store

import (
	"context"
	"time"
)

// ExportHold is a change of the SPIRE registrations the export safeguards
// held back (docs/spire.md): an export that would withdraw or ban more
// nodes at once than the threshold allows. It is applied only once the
// owner allows its digest (fleetd export allow --digest D).
type ExportHold struct {
	// Digest names the export document ("sha256:" + hex).
	Digest string
	// Nodes is how many nodes the change would withdraw or ban;
	// Withdrawals and Bans count its entry deletions and agent bans.
	Nodes       int
	Withdrawals int
	Bans        int
	// Detail says what was held (bounded text; never a secret).
	Detail string
	// FirstHeld and LastHeld are the first and latest runs that held it.
	FirstHeld time.Time
	LastHeld  time.Time
	// AllowedAt is zero until the owner allows it; AllowedBy names them.
	AllowedAt time.Time
	AllowedBy string
}

// ExportSafeguards keeps the export safeguards' state, so that a held
// change and an allowance survive restarts and reach every replica.
type ExportSafeguards interface {
	// HoldExport records a held change: a new digest is inserted with
	// FirstHeld = LastHeld = h.LastHeld; a known one has its counts,
	// detail and LastHeld replaced (FirstHeld and an allowance kept). When
	// max holds are kept and the digest is new, the one held longest ago
	// is removed first (max < 1 is an error).
	HoldExport(ctx context.Context, h ExportHold, max int) error
	// AllowExport marks the held change with this digest allowed by by at
	// now and returns it; ErrNotFound if no change with that digest is
	// held. The audit event, when not nil, is appended in the same
	// transaction.
	AllowExport(ctx context.Context, digest, by string, now time.Time, audit *AuditEvent) (ExportHold, error)
	// GetExportHold returns the held change with this digest; ErrNotFound
	// if there is none.
	GetExportHold(ctx context.Context, digest string) (ExportHold, error)
	// ListExportHolds returns at most limit held changes, the latest held
	// first. A limit below 1 is an error.
	ListExportHolds(ctx context.Context, limit int) ([]ExportHold, error)

	// DeleteJoinCredentials removes what could still start a join of the
	// node: its unused join tokens (those made for this node id) and its
	// pending joins, and returns how many of each it removed. The audit
	// event, when not nil, is appended in the same transaction.
	DeleteJoinCredentials(ctx context.Context, nodeID string, audit *AuditEvent) (tokens, pending int, err error)
}
