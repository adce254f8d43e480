package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// intakeLock is the advisory lock key of the intake sessions' bound (the
// bytes of "ntintake").
const intakeLock = 0x6e74696e74616b65

const intakeColumns = `id, device, ek_pin, ek_public, ak_name, ak_public, ldevid_serial, lak_serial, created_at, expires_at, boot_verdict`

// PutIntakeSession stores a passed intake's session after removing those
// expired at now; ErrConflict when its ID exists or max unexpired
// sessions are stored. Replicas take a lock for the count, so the bound
// holds across them.
func (d *DB) PutIntakeSession(ctx context.Context, s store.IntakeSession, now time.Time, max int) error {
	if s.ID == "" {
		return errors.New("put intake session: no id")
	}
	if now.IsZero() {
		return errors.New("put intake session: no time given")
	}
	err := d.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(intakeLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM intake_sessions WHERE expires_at IS NULL OR expires_at <= $1`, ts(now)); err != nil {
			return fmt.Errorf("remove expired intake sessions: %w", err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM intake_sessions`).Scan(&n); err != nil {
			return fmt.Errorf("count intake sessions: %w", err)
		}
		if n >= max {
			return fmt.Errorf("%d intake sessions are open, the most allowed: %w", n, store.ErrConflict)
		}
		tag, err := tx.Exec(ctx, `INSERT INTO intake_sessions (`+intakeColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING`,
			s.ID, s.Device, s.EKPin, nonNil(s.EKPublic), nonNil(s.AKName), nonNil(s.AKPublic),
			s.LDevIDSerial, s.LAKSerial, ts(s.CreatedAt), ts(s.ExpiresAt), s.BootVerdict)
		if err != nil {
			return err
		}
		return mustChange(tag, fmt.Errorf("an intake session with this id exists: %w", store.ErrConflict))
	})
	if err != nil {
		return fmt.Errorf("put intake session: %w", err)
	}
	return nil
}

// GetIntakeSession returns the session id, expired or not; ErrNotFound if
// there is none.
func (d *DB) GetIntakeSession(ctx context.Context, id string) (store.IntakeSession, error) {
	var (
		s                store.IntakeSession
		created, expires *time.Time
	)
	err := d.pool.QueryRow(ctx, `SELECT `+intakeColumns+` FROM intake_sessions WHERE id = $1`, id).Scan(
		&s.ID, &s.Device, &s.EKPin, &s.EKPublic, &s.AKName, &s.AKPublic, &s.LDevIDSerial, &s.LAKSerial, &created, &expires, &s.BootVerdict)
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.IntakeSession{}, fmt.Errorf("get intake session %q: %w", id, wrap(err))
	}
	s.CreatedAt, s.ExpiresAt = fromTS(created), fromTS(expires)
	return s, nil
}

// nonNil stores an empty byte string for nil, so a NOT NULL bytea column
// takes it.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
