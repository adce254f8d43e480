package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const pendingColumns = `id, token_hash, token_id, csr_hash, node_id, role, site,
	product_uuid, serials, macs, gpu_uuids, hostname, boot_id,
	created_at, expires_at, approved_at, approved_by`

// CreatePending stores a join waiting for approval; ErrConflict if its ID
// exists. The pending join must have an ID and a node id.
func (d *DB) CreatePending(ctx context.Context, p store.Pending) error {
	if p.ID == "" || p.NodeID == "" {
		return fmt.Errorf("create pending join %q for node %q: pending join has no id or no node", p.ID, p.NodeID)
	}
	tag, err := d.pool.Exec(ctx, `INSERT INTO pending_joins (`+pendingColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) ON CONFLICT DO NOTHING`,
		p.ID, p.TokenHash, p.TokenID, p.CSRHash, p.NodeID, p.Role, p.Site,
		p.Claims.ProductUUID, list(p.Claims.Serials), list(p.Claims.MACs), list(p.Claims.GPUUUIDs),
		p.Claims.Hostname, p.Claims.BootID, ts(p.CreatedAt), ts(p.ExpiresAt), ts(p.ApprovedAt), p.ApprovedBy)
	if err == nil {
		err = mustChange(tag, fmt.Errorf("a pending join with this id exists: %w", store.ErrConflict))
	}
	if err != nil {
		return fmt.Errorf("create pending join %s: %w", p.ID, wrap(err))
	}
	return nil
}

// GetPending returns one pending join by ID, expired or not; ErrNotFound
// if there is none.
func (d *DB) GetPending(ctx context.Context, id string) (store.Pending, error) {
	p, err := scanPending(d.pool.QueryRow(ctx, `SELECT `+pendingColumns+` FROM pending_joins WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Pending{}, fmt.Errorf("get pending join %q: %w", id, wrap(err))
	}
	return p, nil
}

// ListPending returns the pending joins, approved or not, that have not
// expired at now, oldest first (ties by ID).
func (d *DB) ListPending(ctx context.Context, now time.Time) ([]store.Pending, error) {
	if now.IsZero() {
		return nil, errors.New("list pending joins: no time given")
	}
	rows, err := d.pool.Query(ctx, `SELECT `+pendingColumns+` FROM pending_joins
		WHERE expires_at > $1 ORDER BY created_at NULLS FIRST, id`, ts(now))
	if err != nil {
		return nil, fmt.Errorf("list pending joins: %w", wrap(err))
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Pending, error) { return scanPending(r) })
	if err != nil {
		return nil, fmt.Errorf("list pending joins: %w", wrap(err))
	}
	return ps, nil
}

// ApprovePending marks the pending joins of nodeID that are neither
// expired at now nor approved as approved by by at now, and returns them,
// oldest first; ErrNotFound if there is none.
func (d *DB) ApprovePending(ctx context.Context, nodeID, by string, now time.Time) ([]store.Pending, error) {
	if now.IsZero() {
		return nil, fmt.Errorf("approve pending joins of node %q: no time given", nodeID)
	}
	var ps []store.Pending
	err := d.tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE pending_joins SET approved_at = $1, approved_by = $2
			WHERE node_id = $3 AND approved_at IS NULL AND expires_at > $1
			RETURNING `+pendingColumns, ts(now), by, nodeID)
		if err != nil {
			return err
		}
		if ps, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Pending, error) { return scanPending(r) }); err != nil {
			return err
		}
		if len(ps) == 0 {
			return fmt.Errorf("no unexpired pending join waits for approval: %w", store.ErrNotFound)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("approve pending joins of node %q: %w", nodeID, err)
	}
	slices.SortFunc(ps, func(a, b store.Pending) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return ps, nil
}

func scanPending(s pgx.Row) (store.Pending, error) {
	var (
		p                          store.Pending
		created, expires, approved *time.Time
	)
	if err := s.Scan(&p.ID, &p.TokenHash, &p.TokenID, &p.CSRHash, &p.NodeID, &p.Role, &p.Site,
		&p.Claims.ProductUUID, &p.Claims.Serials, &p.Claims.MACs, &p.Claims.GPUUUIDs,
		&p.Claims.Hostname, &p.Claims.BootID, &created, &expires, &approved, &p.ApprovedBy); err != nil {
		return store.Pending{}, err
	}
	p.Claims.Serials, p.Claims.MACs, p.Claims.GPUUUIDs = fromList(p.Claims.Serials), fromList(p.Claims.MACs), fromList(p.Claims.GPUUUIDs)
	if len(p.TokenHash) == 0 {
		p.TokenHash = nil
	}
	if len(p.CSRHash) == 0 {
		p.CSRHash = nil
	}
	p.CreatedAt, p.ExpiresAt, p.ApprovedAt = fromTS(created), fromTS(expires), fromTS(approved)
	return p, nil
}
