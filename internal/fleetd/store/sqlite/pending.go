package sqlite

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const pendingColumns = `id, token_hash, token_id, csr_hash, node_id, role, site,
	product_uuid, serials, macs, gpu_uuids, hostname, boot_id,
	created_at, expires_at, approved_at, approved_by`

var (
	qInsertPending = newWriteQuery(`INSERT INTO pending_joins (` + pendingColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`)
	qApprovePending = newWriteQuery(`UPDATE pending_joins SET approved_at = ?1, approved_by = ?2
		WHERE node_id = ?3 AND approved_at IS NULL AND expires_at > ?1
		RETURNING ` + pendingColumns)
	qTakePending = newWriteQuery(`DELETE FROM pending_joins WHERE id = ?
		RETURNING approved_at, node_id, token_hash`)
	qGetPending  = newReadQuery(`SELECT ` + pendingColumns + ` FROM pending_joins WHERE id = ?`)
	qListPending = newReadQuery(`SELECT ` + pendingColumns + ` FROM pending_joins
		WHERE expires_at > ? ORDER BY created_at NULLS FIRST, id`)
)

// CreatePending stores a join waiting for approval; ErrConflict if its ID
// exists. The pending join must have an ID and a node id.
func (d *DB) CreatePending(ctx context.Context, p store.Pending) error {
	if p.ID == "" || p.NodeID == "" {
		return fmt.Errorf("create pending join %q for node %q: pending join has no id or no node", p.ID, p.NodeID)
	}
	var a args
	vals := []any{p.ID, p.TokenHash, p.TokenID, p.CSRHash, p.NodeID, p.Role, p.Site,
		p.Claims.ProductUUID, a.list(p.Claims.Serials), a.list(p.Claims.MACs), a.list(p.Claims.GPUUUIDs),
		p.Claims.Hostname, p.Claims.BootID,
		a.time(p.CreatedAt), a.time(p.ExpiresAt), a.time(p.ApprovedAt), p.ApprovedBy}
	if a.err != nil {
		return fmt.Errorf("create pending join %s: %w", p.ID, a.err)
	}
	err := d.write(ctx, func(t *wtx) error {
		res, err := t.exec(qInsertPending, vals...)
		if err != nil {
			return err
		}
		return mustChange(res, fmt.Errorf("a pending join with this id exists: %w", store.ErrConflict))
	})
	if err != nil {
		return fmt.Errorf("create pending join %s: %w", p.ID, err)
	}
	return nil
}

// GetPending returns one pending join by ID, expired or not; ErrNotFound
// if there is none.
func (d *DB) GetPending(ctx context.Context, id string) (store.Pending, error) {
	p, err := scanPending(d.queryRow(ctx, qGetPending, id))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Pending{}, fmt.Errorf("get pending join %q: %w", id, err)
	}
	return p, nil
}

// ListPending returns the pending joins, approved or not, that have not
// expired at now, oldest (earliest CreatedAt) first; pending joins created
// at the same time are ordered by ID. A pending join expires when now
// reaches its ExpiresAt; one without an ExpiresAt has expired.
func (d *DB) ListPending(ctx context.Context, now time.Time) ([]store.Pending, error) {
	at, err := nowArg(now)
	if err != nil {
		return nil, fmt.Errorf("list pending joins: %w", err)
	}
	rows, err := d.query(ctx, qListPending, at)
	if err != nil {
		return nil, fmt.Errorf("list pending joins: %w", err)
	}
	ps, err := collectPending(rows)
	if err != nil {
		return nil, fmt.Errorf("list pending joins: %w", err)
	}
	return ps, nil
}

// ApprovePending marks the pending joins of nodeID that are neither
// expired at now nor approved as approved by by at now, and returns them,
// oldest first as ListPending orders them. It returns ErrNotFound if there
// is none; pending joins approved before are left as they are.
func (d *DB) ApprovePending(ctx context.Context, nodeID, by string, now time.Time) ([]store.Pending, error) {
	at, err := nowArg(now)
	if err != nil {
		return nil, fmt.Errorf("approve pending joins of node %q: %w", nodeID, err)
	}
	var ps []store.Pending
	err = d.write(ctx, func(t *wtx) error {
		rows, err := t.query(qApprovePending, at, by, nodeID)
		if err != nil {
			return err
		}
		if ps, err = collectPending(rows); err != nil {
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
	// RETURNING gives the rows in no particular order.
	slices.SortFunc(ps, func(a, b store.Pending) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return ps, nil
}

// takePending removes the pending join id that the join of node nodeID
// spending the token tokenHash completes. It returns an error wrapping
// ErrConflict, and the caller must roll back, when there is no such pending
// join, when it is not approved, or when it was made for another node or
// another token.
func takePending(t *wtx, id, nodeID string, tokenHash []byte) error {
	var (
		approved  sql.NullInt64
		node      string
		pendToken []byte
	)
	err := t.queryRow(qTakePending, id).Scan(&approved, &node, &pendToken)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("no pending join %q: %w", id, store.ErrConflict)
	case err != nil:
		return fmt.Errorf("remove pending join %q: %w", id, err)
	case !approved.Valid:
		return fmt.Errorf("pending join %q is not approved: %w", id, store.ErrConflict)
	case node != nodeID:
		return fmt.Errorf("pending join %q is for node %q: %w", id, node, store.ErrConflict)
	case !bytes.Equal(pendToken, tokenHash):
		return fmt.Errorf("pending join %q was made with another token: %w", id, store.ErrConflict)
	}
	return nil
}

// nowArg converts the current time of a query, which must be given.
func nowArg(now time.Time) (sql.NullInt64, error) {
	var a args
	at := a.time(now)
	if a.err != nil {
		return sql.NullInt64{}, a.err
	}
	if !at.Valid {
		return sql.NullInt64{}, errors.New("no time given")
	}
	return at, nil
}

func collectPending(rows *sql.Rows) ([]store.Pending, error) {
	defer rows.Close()
	var ps []store.Pending
	for rows.Next() {
		p, err := scanPending(rows)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return ps, rows.Close()
}

func scanPending(s scanner) (store.Pending, error) {
	var (
		p                          store.Pending
		serials, macs, gpus        string
		created, expires, approved sql.NullInt64
	)
	if err := s.Scan(&p.ID, &p.TokenHash, &p.TokenID, &p.CSRHash, &p.NodeID, &p.Role, &p.Site,
		&p.Claims.ProductUUID, &serials, &macs, &gpus, &p.Claims.Hostname, &p.Claims.BootID,
		&created, &expires, &approved, &p.ApprovedBy); err != nil {
		return store.Pending{}, err
	}
	var err error
	if p.Claims.Serials, err = fromList(serials); err != nil {
		return store.Pending{}, fmt.Errorf("pending join %q serials: %w", p.ID, err)
	}
	if p.Claims.MACs, err = fromList(macs); err != nil {
		return store.Pending{}, fmt.Errorf("pending join %q macs: %w", p.ID, err)
	}
	if p.Claims.GPUUUIDs, err = fromList(gpus); err != nil {
		return store.Pending{}, fmt.Errorf("pending join %q gpu uuids: %w", p.ID, err)
	}
	if len(p.TokenHash) == 0 {
		p.TokenHash = nil
	}
	if len(p.CSRHash) == 0 {
		p.CSRHash = nil
	}
	p.CreatedAt, p.ExpiresAt, p.ApprovedAt = fromNanos(created), fromNanos(expires), fromNanos(approved)
	return p, nil
}
