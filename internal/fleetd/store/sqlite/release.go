package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const releaseColumns = `uuid, node_id, generation, verifier, sealed, content_type, created_at, expires_at, state, claim_id,
	claimed_until, burned_at, activation, activated_at, activation_attempts, activation_error`

var (
	qReleaseGeneration = newWriteQuery(`SELECT generation FROM config_releases WHERE uuid = ?`)
	qPutRelease        = newWriteQuery(`INSERT OR REPLACE INTO config_releases (` + releaseColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'ready', '', NULL, NULL, '', NULL, 0, '') RETURNING ` + releaseColumns)
	qGetRelease   = newReadQuery(`SELECT ` + releaseColumns + ` FROM config_releases WHERE uuid = ?`)
	qClaimRelease = newWriteQuery(`UPDATE config_releases SET state = 'claimed', claim_id = ?, claimed_until = ?
		WHERE uuid = ? AND generation = ? AND expires_at > ?
		AND (state = 'ready' OR (state = 'claimed' AND claimed_until <= ?))`)
	qReleaseExists  = newWriteQuery(`SELECT count(*) FROM config_releases WHERE uuid = ?`)
	qUnclaimRelease = newWriteQuery(`UPDATE config_releases SET state = 'ready', claim_id = '', claimed_until = NULL
		WHERE uuid = ? AND generation = ? AND state = 'claimed' AND claim_id = ?`)
	qBurnRelease = newWriteQuery(`UPDATE config_releases SET state = 'burned', claim_id = '', claimed_until = NULL, burned_at = ?, sealed = x''
		WHERE uuid = ? AND generation = ? AND state = 'claimed' AND claim_id = ?`)
	qListUnsettled = newReadQuery(`SELECT ` + releaseColumns + ` FROM config_releases
		WHERE state = 'burned' AND activation = '' ORDER BY burned_at, uuid LIMIT ?`)
	qSettleActivation = newWriteQuery(`UPDATE config_releases SET activation = ?, activated_at = ?
		WHERE uuid = ? AND generation = ? AND state = 'burned' AND activation = ''`)
	qFailActivation = newWriteQuery(`UPDATE config_releases SET activation_attempts = activation_attempts + 1, activation_error = ?
		WHERE uuid = ? AND generation = ? AND state = 'burned' AND activation = ''`)
	qPurgeReleases = newWriteQuery(`UPDATE config_releases SET sealed = x''
		WHERE state <> 'burned' AND expires_at <= ? AND length(sealed) > 0`)
)

// PutConfigRelease stores a release in place of the UUID's earlier one.
func (d *DB) PutConfigRelease(ctx context.Context, r store.ConfigRelease, audit *store.AuditEvent) (store.ConfigRelease, error) {
	if r.UUID == "" || len(r.Verifier) == 0 || r.ExpiresAt.IsZero() {
		return store.ConfigRelease{}, errors.New("put config release: a UUID, a verifier and an expiry are required")
	}
	var a args
	created, expires := a.time(r.CreatedAt), a.time(r.ExpiresAt)
	auditVals := auditArgs(&a, audit)
	if a.err != nil {
		return store.ConfigRelease{}, fmt.Errorf("put config release of %s: %w", r.UUID, a.err)
	}
	sealed := blobOf(r.Sealed)
	var out store.ConfigRelease
	err := d.write(ctx, func(t *wtx) error {
		var gen int64
		err := t.queryRow(qReleaseGeneration, r.UUID).Scan(&gen)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		out, err = scanRelease(t.queryRow(qPutRelease, r.UUID, r.NodeID, gen+1, r.Verifier, sealed, r.ContentType, created, expires))
		if err != nil {
			return err
		}
		if audit == nil {
			return nil
		}
		return insertAudit(t, auditVals)
	})
	if err != nil {
		return store.ConfigRelease{}, fmt.Errorf("put config release of %s: %w", r.UUID, err)
	}
	return out, nil
}

// GetConfigRelease returns the release of uuid.
func (d *DB) GetConfigRelease(ctx context.Context, uuid string) (store.ConfigRelease, error) {
	r, err := scanRelease(d.queryRow(ctx, qGetRelease, uuid))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.ConfigRelease{}, fmt.Errorf("get config release of %s: %w", uuid, err)
	}
	return r, nil
}

// ClaimConfigRelease gives the release to one fetch.
func (d *DB) ClaimConfigRelease(ctx context.Context, uuid string, generation uint64, claim string, now, until time.Time) error {
	if claim == "" {
		return errors.New("claim config release: no claim id")
	}
	var a args
	at, end, gen := a.time(now), a.time(until), a.gen(generation)
	if a.err != nil {
		return fmt.Errorf("claim config release of %s: %w", uuid, a.err)
	}
	err := d.write(ctx, func(t *wtx) error {
		res, err := t.exec(qClaimRelease, claim, end, uuid, gen, at, at)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		var n int
		if err := t.queryRow(qReleaseExists, uuid).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return store.ErrNotFound
		}
		return store.ErrConflict
	})
	if err != nil {
		return fmt.Errorf("claim config release of %s: %w", uuid, err)
	}
	return nil
}

// UnclaimConfigRelease makes a claimed release ready again.
func (d *DB) UnclaimConfigRelease(ctx context.Context, uuid string, generation uint64, claim string) error {
	return d.changeRelease(ctx, "unclaim config release", uuid, qUnclaimRelease, uuid, int64(generation), claim)
}

// BurnConfigRelease marks a claimed release delivered.
func (d *DB) BurnConfigRelease(ctx context.Context, uuid string, generation uint64, claim string, now time.Time) error {
	var a args
	at := a.time(now)
	if a.err != nil {
		return fmt.Errorf("burn config release of %s: %w", uuid, a.err)
	}
	return d.changeRelease(ctx, "burn config release", uuid, qBurnRelease, at, uuid, int64(generation), claim)
}

// SettleActivation records how a burned release's activation ended.
func (d *DB) SettleActivation(ctx context.Context, uuid string, generation uint64, outcome string, now time.Time) error {
	if outcome == "" {
		return errors.New("settle activation: no outcome")
	}
	var a args
	at := a.time(now)
	if a.err != nil {
		return fmt.Errorf("settle activation of %s: %w", uuid, a.err)
	}
	return d.changeRelease(ctx, "settle activation", uuid, qSettleActivation, outcome, at, uuid, int64(generation))
}

// FailActivation records a failed activation attempt.
func (d *DB) FailActivation(ctx context.Context, uuid string, generation uint64, reason string) error {
	return d.changeRelease(ctx, "record failed activation", uuid, qFailActivation, reason, uuid, int64(generation))
}

// changeRelease runs a conditional update of one release: ErrConflict when
// it changed no row.
func (d *DB) changeRelease(ctx context.Context, what, uuid string, q writeQuery, vals ...any) error {
	err := d.write(ctx, func(t *wtx) error {
		res, err := t.exec(q, vals...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n != 1 {
			return store.ErrConflict
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s of %s: %w", what, uuid, err)
	}
	return nil
}

// ListUnsettledReleases returns burned releases whose activation is not
// settled, burned longest ago first.
func (d *DB) ListUnsettledReleases(ctx context.Context, limit int) ([]store.ConfigRelease, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list unsettled releases: limit %d is not positive", limit)
	}
	out, err := queryAll(ctx, d, scanRelease, qListUnsettled, limit)
	if err != nil {
		return nil, fmt.Errorf("list unsettled releases: %w", err)
	}
	return out, nil
}

// PurgeExpiredReleases drops the sealed configs of expired releases.
func (d *DB) PurgeExpiredReleases(ctx context.Context, now time.Time) (int, error) {
	var a args
	at := a.time(now)
	if a.err != nil {
		return 0, fmt.Errorf("purge expired releases: %w", a.err)
	}
	var n int64
	err := d.write(ctx, func(t *wtx) error {
		res, err := t.exec(qPurgeReleases, at)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("purge expired releases: %w", err)
	}
	return int(n), nil
}

func scanRelease(r scanner) (store.ConfigRelease, error) {
	var (
		c                                        store.ConfigRelease
		gen                                      int64
		created, expires, until, burned, settled sql.NullInt64
	)
	if err := r.Scan(&c.UUID, &c.NodeID, &gen, &c.Verifier, &c.Sealed, &c.ContentType, &created, &expires, &c.State, &c.ClaimID,
		&until, &burned, &c.Activation, &settled, &c.ActivationAttempts, &c.ActivationError); err != nil {
		return store.ConfigRelease{}, err
	}
	c.Generation = uint64(gen)
	c.CreatedAt, c.ExpiresAt, c.ClaimedUntil, c.BurnedAt, c.ActivatedAt = fromNanos(created), fromNanos(expires), fromNanos(until), fromNanos(burned), fromNanos(settled)
	if len(c.Sealed) == 0 {
		c.Sealed = nil
	}
	return c, nil
}
