package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const tokenColumns = `id, hash, role, site, node_id, allow_reclaim, require_approval,
	created_by, created_at, expires_at, used_at, used_by`

var (
	qInsertToken = newWriteQuery(`INSERT INTO tokens (` + tokenColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`)
	qSpendToken = newWriteQuery(`UPDATE tokens SET used_at = ?1, used_by = ?2
		WHERE hash = ?3 AND used_at IS NULL AND expires_at > ?1`)
	qTokenState  = newWriteQuery(`SELECT id, used_at, used_by, expires_at FROM tokens WHERE hash = ?`)
	qTokenByHash = newReadQuery(`SELECT ` + tokenColumns + ` FROM tokens WHERE hash = ?`)
	qListTokens  = newReadQuery(`SELECT ` + tokenColumns + ` FROM tokens ORDER BY created_at DESC NULLS LAST, id`)
)

// CreateToken stores a new token; ErrConflict if its ID or its hash exists.
func (d *DB) CreateToken(ctx context.Context, t store.Token) error {
	if t.ID == "" || len(t.Hash) == 0 {
		return fmt.Errorf("create token %q: token has no id or no hash", t.ID)
	}
	var a args
	vals := []any{t.ID, t.Hash, t.Role, t.Site, t.NodeID, t.AllowReclaim, t.RequireApproval,
		t.CreatedBy, a.time(t.CreatedAt), a.time(t.ExpiresAt), a.time(t.UsedAt), t.UsedBy}
	if a.err != nil {
		return fmt.Errorf("create token %s: %w", t.ID, a.err)
	}
	err := d.write(ctx, func(t *wtx) error {
		res, err := t.exec(qInsertToken, vals...)
		if err != nil {
			return err
		}
		return mustChange(res, fmt.Errorf("a token with this id or hash exists: %w", store.ErrConflict))
	})
	if err != nil {
		return fmt.Errorf("create token %s: %w", t.ID, err)
	}
	return nil
}

// TokenByHash returns the token with this hash, used or not; ErrNotFound if
// there is none.
func (d *DB) TokenByHash(ctx context.Context, hash []byte) (store.Token, error) {
	t, err := scanToken(d.queryRow(ctx, qTokenByHash, hash))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("get token by hash: %w", err)
	}
	return t, nil
}

// ListTokens returns all tokens, newest (latest CreatedAt) first; tokens
// created at the same time are ordered by ID.
func (d *DB) ListTokens(ctx context.Context) ([]store.Token, error) {
	ts, err := queryAll(ctx, d, scanToken, qListTokens)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return ts, nil
}

// spendToken marks the token with hash used by nodeID at now, if it is
// unused and unexpired at now; otherwise it returns an error wrapping
// ErrConflict that says why.
func spendToken(t *wtx, hash []byte, nodeID string, now sql.NullInt64) error {
	res, err := t.exec(qSpendToken, now, nodeID, hash)
	if err != nil {
		return fmt.Errorf("spend token: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	// Say why, for the log; the caller refuses the join either way.
	var (
		id       string
		usedAt   sql.NullInt64
		usedBy   string
		deadline sql.NullInt64
	)
	err = t.queryRow(qTokenState, hash).
		Scan(&id, &usedAt, &usedBy, &deadline)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("unknown token: %w", store.ErrConflict)
	case err != nil:
		return fmt.Errorf("spend token: %w", err)
	case usedAt.Valid:
		return fmt.Errorf("token %s already used by node %q: %w", id, usedBy, store.ErrConflict)
	default:
		return fmt.Errorf("token %s expired: %w", id, store.ErrConflict)
	}
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

func scanToken(s scanner) (store.Token, error) {
	var (
		t                        store.Token
		created, expires, usedAt sql.NullInt64
	)
	if err := s.Scan(&t.ID, &t.Hash, &t.Role, &t.Site, &t.NodeID, &t.AllowReclaim, &t.RequireApproval,
		&t.CreatedBy, &created, &expires, &usedAt, &t.UsedBy); err != nil {
		return store.Token{}, err
	}
	t.CreatedAt, t.ExpiresAt, t.UsedAt = fromNanos(created), fromNanos(expires), fromNanos(usedAt)
	return t, nil
}

// mustChange returns conflict unless res changed a row.
func mustChange(res sql.Result, conflict error) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return conflict
	}
	return nil
}
