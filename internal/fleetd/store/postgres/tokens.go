package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const tokenColumns = `id, hash, role, site, node_id, allow_reclaim, require_approval,
	created_by, created_at, expires_at, used_at, used_by`

// CreateToken stores a new token; ErrConflict if its ID or its hash exists.
func (d *DB) CreateToken(ctx context.Context, t store.Token) error {
	if t.ID == "" || len(t.Hash) == 0 {
		return fmt.Errorf("create token %q: token has no id or no hash", t.ID)
	}
	tag, err := d.pool.Exec(ctx, `INSERT INTO tokens (`+tokenColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT DO NOTHING`,
		t.ID, t.Hash, t.Role, t.Site, t.NodeID, t.AllowReclaim, t.RequireApproval,
		t.CreatedBy, ts(t.CreatedAt), ts(t.ExpiresAt), ts(t.UsedAt), t.UsedBy)
	if err == nil {
		err = mustChange(tag, fmt.Errorf("a token with this id or hash exists: %w", store.ErrConflict))
	}
	if err != nil {
		return fmt.Errorf("create token %s: %w", t.ID, wrap(err))
	}
	return nil
}

// TokenByHash returns the token with this hash, used or not; ErrNotFound if
// there is none.
func (d *DB) TokenByHash(ctx context.Context, hash []byte) (store.Token, error) {
	t, err := scanToken(d.pool.QueryRow(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE hash = $1`, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("get token by hash: %w", wrap(err))
	}
	return t, nil
}

// ListTokens returns all tokens, newest (latest CreatedAt) first; tokens
// created at the same time are ordered by ID.
func (d *DB) ListTokens(ctx context.Context) ([]store.Token, error) {
	rows, err := d.pool.Query(ctx, `SELECT `+tokenColumns+` FROM tokens ORDER BY created_at DESC NULLS LAST, id`)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", wrap(err))
	}
	ts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Token, error) { return scanToken(r) })
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", wrap(err))
	}
	return ts, nil
}

// spendToken marks the token with hash used by nodeID at now, if it is
// unused and unexpired at now; otherwise it returns an error wrapping
// ErrConflict that says why. The UPDATE's row lock makes concurrent spends
// of one token wait for each other, and the re-checked condition lets one
// of them through.
func spendToken(ctx context.Context, tx pgx.Tx, hash []byte, nodeID string, now time.Time) error {
	tag, err := tx.Exec(ctx, `UPDATE tokens SET used_at = $1, used_by = $2
		WHERE hash = $3 AND used_at IS NULL AND expires_at > $1`, ts(now), nodeID, hash)
	if err != nil {
		return fmt.Errorf("spend token: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var (
		id               string
		usedAt, deadline *time.Time
		usedBy           string
	)
	err = tx.QueryRow(ctx, `SELECT id, used_at, used_by, expires_at FROM tokens WHERE hash = $1`, hash).
		Scan(&id, &usedAt, &usedBy, &deadline)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("unknown token: %w", store.ErrConflict)
	case err != nil:
		return fmt.Errorf("spend token: %w", err)
	case usedAt != nil:
		return fmt.Errorf("token %s already used by node %q: %w", id, usedBy, store.ErrConflict)
	default:
		return fmt.Errorf("token %s expired: %w", id, store.ErrConflict)
	}
}

func scanToken(s pgx.Row) (store.Token, error) {
	var (
		t                        store.Token
		created, expires, usedAt *time.Time
	)
	if err := s.Scan(&t.ID, &t.Hash, &t.Role, &t.Site, &t.NodeID, &t.AllowReclaim, &t.RequireApproval,
		&t.CreatedBy, &created, &expires, &usedAt, &t.UsedBy); err != nil {
		return store.Token{}, err
	}
	t.CreatedAt, t.ExpiresAt, t.UsedAt = fromTS(created), fromTS(expires), fromTS(usedAt)
	return t, nil
}
