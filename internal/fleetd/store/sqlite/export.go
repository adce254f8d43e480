package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const exportHoldColumns = `digest, nodes, withdrawals, bans, detail, first_held, last_held, allowed_at, allowed_by`

var (
	qExportHoldExists = newWriteQuery(`SELECT count(*) FROM export_holds WHERE digest = ?`)
	qCountExportHolds = newWriteQuery(`SELECT count(*) FROM export_holds`)
	qEvictExportHolds = newWriteQuery(`DELETE FROM export_holds WHERE digest IN
		(SELECT digest FROM export_holds ORDER BY last_held, digest LIMIT ?)`)
	qInsertExportHold = newWriteQuery(`INSERT INTO export_holds (` + exportHoldColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, '')`)
	qUpdateExportHold = newWriteQuery(`UPDATE export_holds SET nodes = ?, withdrawals = ?, bans = ?, detail = ?, last_held = ? WHERE digest = ?`)
	qAllowExport      = newWriteQuery(`UPDATE export_holds SET allowed_at = ?, allowed_by = ? WHERE digest = ? RETURNING ` + exportHoldColumns)
	qGetExportHold    = newReadQuery(`SELECT ` + exportHoldColumns + ` FROM export_holds WHERE digest = ?`)
	qListExportHolds  = newReadQuery(`SELECT ` + exportHoldColumns + ` FROM export_holds ORDER BY last_held DESC, digest LIMIT ?`)

	qDeleteNodeTokens  = newWriteQuery(`DELETE FROM tokens WHERE node_id = ? AND node_id <> '' AND used_at IS NULL`)
	qDeleteNodePending = newWriteQuery(`DELETE FROM pending_joins WHERE node_id = ? AND node_id <> ''`)
)

// HoldExport records a held change (see store.ExportSafeguards).
func (d *DB) HoldExport(ctx context.Context, h store.ExportHold, max int) error {
	if h.Digest == "" {
		return errors.New("hold export: no digest")
	}
	if max < 1 {
		return fmt.Errorf("hold export: max %d is not positive", max)
	}
	var a args
	at := a.time(h.LastHeld)
	if a.err != nil {
		return fmt.Errorf("hold export: %w", a.err)
	}
	err := d.write(ctx, func(t *wtx) error {
		var n int
		if err := t.queryRow(qExportHoldExists, h.Digest).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			_, err := t.exec(qUpdateExportHold, h.Nodes, h.Withdrawals, h.Bans, h.Detail, at, h.Digest)
			return err
		}
		if err := t.queryRow(qCountExportHolds).Scan(&n); err != nil {
			return err
		}
		if n >= max {
			if _, err := t.exec(qEvictExportHolds, n-max+1); err != nil {
				return err
			}
		}
		_, err := t.exec(qInsertExportHold, h.Digest, h.Nodes, h.Withdrawals, h.Bans, h.Detail, at, at)
		return err
	})
	if err != nil {
		return fmt.Errorf("hold export %s: %w", h.Digest, err)
	}
	return nil
}

// AllowExport marks a held change allowed.
func (d *DB) AllowExport(ctx context.Context, digest, by string, now time.Time, audit *store.AuditEvent) (store.ExportHold, error) {
	var a args
	at := a.time(now)
	auditVals := auditArgs(&a, audit)
	if a.err != nil {
		return store.ExportHold{}, fmt.Errorf("allow export %s: %w", digest, a.err)
	}
	var out store.ExportHold
	err := d.write(ctx, func(t *wtx) error {
		h, err := scanExportHold(t.queryRow(qAllowExport, at, by, digest))
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		out = h
		return insertAudit(t, auditVals)
	})
	if err != nil {
		return store.ExportHold{}, fmt.Errorf("allow export %s: %w", digest, err)
	}
	return out, nil
}

// GetExportHold returns one held change.
func (d *DB) GetExportHold(ctx context.Context, digest string) (store.ExportHold, error) {
	h, err := scanExportHold(d.queryRow(ctx, qGetExportHold, digest))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.ExportHold{}, fmt.Errorf("get export hold %s: %w", digest, err)
	}
	return h, nil
}

// ListExportHolds returns the latest held changes first.
func (d *DB) ListExportHolds(ctx context.Context, limit int) ([]store.ExportHold, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list export holds: limit %d is not positive", limit)
	}
	out, err := queryAll(ctx, d, scanExportHold, qListExportHolds, limit)
	if err != nil {
		return nil, fmt.Errorf("list export holds: %w", err)
	}
	return out, nil
}

func scanExportHold(r scanner) (store.ExportHold, error) {
	var (
		h                    store.ExportHold
		first, last, allowed sql.NullInt64
	)
	if err := r.Scan(&h.Digest, &h.Nodes, &h.Withdrawals, &h.Bans, &h.Detail, &first, &last, &allowed, &h.AllowedBy); err != nil {
		return store.ExportHold{}, err
	}
	h.FirstHeld, h.LastHeld, h.AllowedAt = fromNanos(first), fromNanos(last), fromNanos(allowed)
	return h, nil
}

// DeleteJoinCredentials removes a node's unused tokens and pending joins.
func (d *DB) DeleteJoinCredentials(ctx context.Context, nodeID string, audit *store.AuditEvent) (tokens, pending int, err error) {
	if nodeID == "" {
		return 0, 0, errors.New("delete join credentials: no node id")
	}
	var a args
	auditVals := auditArgs(&a, audit)
	if a.err != nil {
		return 0, 0, fmt.Errorf("delete join credentials of %s: %w", nodeID, a.err)
	}
	err = d.write(ctx, func(t *wtx) error {
		res, err := t.exec(qDeleteNodeTokens, nodeID)
		if err != nil {
			return err
		}
		nt, err := res.RowsAffected()
		if err != nil {
			return err
		}
		res, err = t.exec(qDeleteNodePending, nodeID)
		if err != nil {
			return err
		}
		np, err := res.RowsAffected()
		if err != nil {
			return err
		}
		tokens, pending = int(nt), int(np)
		if audit == nil {
			return nil
		}
		return insertAudit(t, auditVals)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("delete join credentials of %s: %w", nodeID, err)
	}
	return tokens, pending, nil
}
