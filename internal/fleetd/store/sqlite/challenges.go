package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var (
	qExpireChallenges = newWriteQuery(`DELETE FROM tpm_challenges WHERE not_after IS NULL OR not_after <= ?`)
	qCountChallenges  = newWriteQuery(`SELECT count(*) FROM tpm_challenges`)
	qInsertChallenge  = newWriteQuery(`INSERT INTO tpm_challenges (id, not_after, state) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`)
	qTakeChallenge    = newWriteQuery(`DELETE FROM tpm_challenges WHERE id = ? RETURNING not_after, state`)
)

// PutChallenge stores an open tpm challenge round after removing those
// expired at now; ErrConflict when its ID exists or max unexpired rounds
// are stored.
func (d *DB) PutChallenge(ctx context.Context, c store.Challenge, now time.Time, max int) error {
	if c.ID == "" {
		return errors.New("put challenge: no id")
	}
	at, err := nowArg(now)
	if err != nil {
		return fmt.Errorf("put challenge: %w", err)
	}
	var a args
	notAfter := a.time(c.NotAfter)
	if a.err != nil {
		return fmt.Errorf("put challenge: %w", a.err)
	}
	err = d.write(ctx, func(t *wtx) error {
		if _, err := t.exec(qExpireChallenges, at); err != nil {
			return fmt.Errorf("remove expired challenges: %w", err)
		}
		var n int
		if err := t.queryRow(qCountChallenges).Scan(&n); err != nil {
			return fmt.Errorf("count challenges: %w", err)
		}
		if n >= max {
			return fmt.Errorf("%d challenges are open, the most allowed: %w", n, store.ErrConflict)
		}
		res, err := t.exec(qInsertChallenge, c.ID, notAfter, c.State)
		if err != nil {
			return err
		}
		return mustChange(res, fmt.Errorf("a challenge with this id exists: %w", store.ErrConflict))
	})
	if err != nil {
		return fmt.Errorf("put challenge: %w", err)
	}
	return nil
}

// TakeChallenge removes the round id and returns it; ErrNotFound if none.
func (d *DB) TakeChallenge(ctx context.Context, id string) (store.Challenge, error) {
	c := store.Challenge{ID: id}
	err := d.write(ctx, func(t *wtx) error {
		var notAfter sql.NullInt64
		if err := t.queryRow(qTakeChallenge, id).Scan(&notAfter, &c.State); err != nil {
			return err
		}
		c.NotAfter = fromNanos(notAfter)
		return nil
	})
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Challenge{}, fmt.Errorf("take challenge: %w", err)
	}
	return c, nil
}
