package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// challengeLock is the advisory lock key of the challenge table's bound
// (the bytes of "ntchalng").
const challengeLock = 0x6e746368616c6e67

// PutChallenge stores an open tpm challenge round after removing those
// expired at now; ErrConflict when its ID exists or max unexpired rounds
// are stored. Replicas take a lock for the count, so the bound holds
// across them.
func (d *DB) PutChallenge(ctx context.Context, c store.Challenge, now time.Time, max int) error {
	if c.ID == "" {
		return errors.New("put challenge: no id")
	}
	if now.IsZero() {
		return errors.New("put challenge: no time given")
	}
	err := d.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(challengeLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM tpm_challenges WHERE not_after IS NULL OR not_after <= $1`, ts(now)); err != nil {
			return fmt.Errorf("remove expired challenges: %w", err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM tpm_challenges`).Scan(&n); err != nil {
			return fmt.Errorf("count challenges: %w", err)
		}
		if n >= max {
			return fmt.Errorf("%d challenges are open, the most allowed: %w", n, store.ErrConflict)
		}
		tag, err := tx.Exec(ctx, `INSERT INTO tpm_challenges (id, not_after, state) VALUES ($1, $2, $3)
			ON CONFLICT DO NOTHING`, c.ID, ts(c.NotAfter), c.State)
		if err != nil {
			return err
		}
		return mustChange(tag, fmt.Errorf("a challenge with this id exists: %w", store.ErrConflict))
	})
	if err != nil {
		return fmt.Errorf("put challenge: %w", err)
	}
	return nil
}

// TakeChallenge removes the round id and returns it; ErrNotFound if none.
func (d *DB) TakeChallenge(ctx context.Context, id string) (store.Challenge, error) {
	c := store.Challenge{ID: id}
	var notAfter *time.Time
	err := d.pool.QueryRow(ctx, `DELETE FROM tpm_challenges WHERE id = $1 RETURNING not_after, state`, id).Scan(&notAfter, &c.State)
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Challenge{}, fmt.Errorf("take challenge: %w", wrap(err))
	}
	c.NotAfter = fromTS(notAfter)
	return c, nil
}
