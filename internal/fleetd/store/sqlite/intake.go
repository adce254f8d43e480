package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const intakeColumns = `id, device, ek_pin, ek_public, ak_name, ak_public, ldevid_serial, lak_serial, created_at, expires_at, boot_verdict`

var (
	qExpireIntake = newWriteQuery(`DELETE FROM intake_sessions WHERE expires_at IS NULL OR expires_at <= ?`)
	qCountIntake  = newWriteQuery(`SELECT count(*) FROM intake_sessions`)
	qInsertIntake = newWriteQuery(`INSERT INTO intake_sessions (` + intakeColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`)
	qGetIntake = newReadQuery(`SELECT ` + intakeColumns + ` FROM intake_sessions WHERE id = ?`)
)

// PutIntakeSession stores a passed intake's session after removing those
// expired at now; ErrConflict when its ID exists or max unexpired
// sessions are stored.
func (d *DB) PutIntakeSession(ctx context.Context, s store.IntakeSession, now time.Time, max int) error {
	if s.ID == "" {
		return errors.New("put intake session: no id")
	}
	at, err := nowArg(now)
	if err != nil {
		return fmt.Errorf("put intake session: %w", err)
	}
	var a args
	created, expires := a.time(s.CreatedAt), a.time(s.ExpiresAt)
	if a.err != nil {
		return fmt.Errorf("put intake session: %w", a.err)
	}
	err = d.write(ctx, func(t *wtx) error {
		if _, err := t.exec(qExpireIntake, at); err != nil {
			return fmt.Errorf("remove expired intake sessions: %w", err)
		}
		var n int
		if err := t.queryRow(qCountIntake).Scan(&n); err != nil {
			return fmt.Errorf("count intake sessions: %w", err)
		}
		if n >= max {
			return fmt.Errorf("%d intake sessions are open, the most allowed: %w", n, store.ErrConflict)
		}
		res, err := t.exec(qInsertIntake, s.ID, s.Device, s.EKPin, blobOf(s.EKPublic), blobOf(s.AKName), blobOf(s.AKPublic),
			s.LDevIDSerial, s.LAKSerial, created, expires, s.BootVerdict)
		if err != nil {
			return err
		}
		return mustChange(res, fmt.Errorf("an intake session with this id exists: %w", store.ErrConflict))
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
		created, expires sql.NullInt64
	)
	err := d.queryRow(ctx, qGetIntake, id).Scan(&s.ID, &s.Device, &s.EKPin, &s.EKPublic, &s.AKName, &s.AKPublic,
		&s.LDevIDSerial, &s.LAKSerial, &created, &expires, &s.BootVerdict)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.IntakeSession{}, fmt.Errorf("get intake session %q: %w", id, err)
	}
	s.CreatedAt, s.ExpiresAt = fromNanos(created), fromNanos(expires)
	return s, nil
}

// blobOf stores an empty byte slice for nil, so a NOT NULL BLOB column
// takes it.
func blobOf(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
