package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const exportHoldColumns = `digest, nodes, withdrawals, bans, detail, first_held, last_held, allowed_at, allowed_by`

// exportHoldsLock is the advisory lock key of the held changes' bound.
const exportHoldsLock = 0x6e74657870686c64

// HoldExport records a held change (see store.ExportSafeguards).
func (d *DB) HoldExport(ctx context.Context, h store.ExportHold, max int) error {
	if h.Digest == "" {
		return errors.New("hold export: no digest")
	}
	if max < 1 {
		return fmt.Errorf("hold export: max %d is not positive", max)
	}
	err := d.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(exportHoldsLock)); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE export_holds SET nodes = $2, withdrawals = $3, bans = $4, detail = $5, last_held = $6 WHERE digest = $1`,
			h.Digest, h.Nodes, h.Withdrawals, h.Bans, h.Detail, ts(h.LastHeld))
		if err != nil || tag.RowsAffected() > 0 {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM export_holds`).Scan(&n); err != nil {
			return err
		}
		if n >= max {
			if _, err := tx.Exec(ctx, `DELETE FROM export_holds WHERE digest IN (
				SELECT digest FROM export_holds ORDER BY last_held NULLS FIRST, digest LIMIT $1)`, n-max+1); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO export_holds (`+exportHoldColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $6, NULL, '')`,
			h.Digest, h.Nodes, h.Withdrawals, h.Bans, h.Detail, ts(h.LastHeld))
		return err
	})
	if err != nil {
		return fmt.Errorf("hold export %s: %w", h.Digest, wrap(err))
	}
	return nil
}

// AllowExport marks a held change allowed.
func (d *DB) AllowExport(ctx context.Context, digest, by string, now time.Time, audit *store.AuditEvent) (store.ExportHold, error) {
	var out store.ExportHold
	err := d.tx(ctx, func(tx pgx.Tx) error {
		h, err := scanExportHold(tx.QueryRow(ctx, `UPDATE export_holds SET allowed_at = $2, allowed_by = $3 WHERE digest = $1 RETURNING `+exportHoldColumns,
			digest, ts(now), by))
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		out = h
		return insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return store.ExportHold{}, fmt.Errorf("allow export %s: %w", digest, wrap(err))
	}
	return out, nil
}

// GetExportHold returns one held change.
func (d *DB) GetExportHold(ctx context.Context, digest string) (store.ExportHold, error) {
	h, err := scanExportHold(d.pool.QueryRow(ctx, `SELECT `+exportHoldColumns+` FROM export_holds WHERE digest = $1`, digest))
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.ExportHold{}, fmt.Errorf("get export hold %s: %w", digest, wrap(err))
	}
	return h, nil
}

// ListExportHolds returns the latest held changes first.
func (d *DB) ListExportHolds(ctx context.Context, limit int) ([]store.ExportHold, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list export holds: limit %d is not positive", limit)
	}
	rows, err := d.pool.Query(ctx, `SELECT `+exportHoldColumns+` FROM export_holds ORDER BY last_held DESC NULLS LAST, digest LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list export holds: %w", wrap(err))
	}
	hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.ExportHold, error) { return scanExportHold(r) })
	if err != nil {
		return nil, fmt.Errorf("list export holds: %w", wrap(err))
	}
	return hs, nil
}

func scanExportHold(r pgx.Row) (store.ExportHold, error) {
	var (
		h                    store.ExportHold
		first, last, allowed *time.Time
	)
	if err := r.Scan(&h.Digest, &h.Nodes, &h.Withdrawals, &h.Bans, &h.Detail, &first, &last, &allowed, &h.AllowedBy); err != nil {
		return store.ExportHold{}, err
	}
	h.FirstHeld, h.LastHeld, h.AllowedAt = fromTS(first), fromTS(last), fromTS(allowed)
	return h, nil
}

// DeleteJoinCredentials removes a node's unused tokens and pending joins.
func (d *DB) DeleteJoinCredentials(ctx context.Context, nodeID string, audit *store.AuditEvent) (tokens, pending int, err error) {
	if nodeID == "" {
		return 0, 0, errors.New("delete join credentials: no node id")
	}
	err = d.tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM tokens WHERE node_id = $1 AND used_at IS NULL`, nodeID)
		if err != nil {
			return err
		}
		tokens = int(tag.RowsAffected())
		tag, err = tx.Exec(ctx, `DELETE FROM pending_joins WHERE node_id = $1`, nodeID)
		if err != nil {
			return err
		}
		pending = int(tag.RowsAffected())
		return insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("delete join credentials of %s: %w", nodeID, wrap(err))
	}
	return tokens, pending, nil
}
