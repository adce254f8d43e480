package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const releaseColumns = `uuid, node_id, generation, verifier, sealed, content_type, created_at, expires_at, state, claim_id,
	claimed_until, burned_at, activation, activated_at, activation_attempts, activation_error`

// PutConfigRelease stores a release in place of the UUID's earlier one, in
// one statement: concurrent renders of one UUID each get a generation of
// their own, and the last written stays.
func (d *DB) PutConfigRelease(ctx context.Context, r store.ConfigRelease, audit *store.AuditEvent) (store.ConfigRelease, error) {
	if r.UUID == "" || len(r.Verifier) == 0 || r.ExpiresAt.IsZero() {
		return store.ConfigRelease{}, errors.New("put config release: a UUID, a verifier and an expiry are required")
	}
	sealed := nonNil(r.Sealed)
	var out store.ConfigRelease
	err := d.tx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = scanRelease(tx.QueryRow(ctx, `INSERT INTO config_releases (`+releaseColumns+`)
			VALUES ($1, $2, 1, $3, $4, $5, $6, $7, 'ready', '', NULL, NULL, '', NULL, 0, '')
			ON CONFLICT (uuid) DO UPDATE SET node_id = EXCLUDED.node_id, generation = config_releases.generation + 1,
				verifier = EXCLUDED.verifier, sealed = EXCLUDED.sealed, content_type = EXCLUDED.content_type,
				created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, state = 'ready', claim_id = '',
				claimed_until = NULL, burned_at = NULL, activation = '', activated_at = NULL, activation_attempts = 0,
				activation_error = ''
			RETURNING `+releaseColumns,
			r.UUID, r.NodeID, r.Verifier, sealed, r.ContentType, ts(r.CreatedAt), ts(r.ExpiresAt)))
		if err != nil {
			return err
		}
		return insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return store.ConfigRelease{}, fmt.Errorf("put config release of %s: %w", r.UUID, wrap(err))
	}
	return out, nil
}

// GetConfigRelease returns the release of uuid.
func (d *DB) GetConfigRelease(ctx context.Context, uuid string) (store.ConfigRelease, error) {
	r, err := scanRelease(d.pool.QueryRow(ctx, `SELECT `+releaseColumns+` FROM config_releases WHERE uuid = $1`, uuid))
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.ConfigRelease{}, fmt.Errorf("get config release of %s: %w", uuid, wrap(err))
	}
	return r, nil
}

// ClaimConfigRelease gives the release to one fetch: a conditional UPDATE,
// which PostgreSQL re-checks on the row a concurrent claim wrote, so one
// claim wins on any replica.
func (d *DB) ClaimConfigRelease(ctx context.Context, uuid string, generation uint64, claim string, now, until time.Time) error {
	if claim == "" {
		return errors.New("claim config release: no claim id")
	}
	tag, err := d.pool.Exec(ctx, `UPDATE config_releases SET state = 'claimed', claim_id = $3, claimed_until = $4
		WHERE uuid = $1 AND generation = $2 AND expires_at > $5
		AND (state = 'ready' OR (state = 'claimed' AND claimed_until <= $5))`,
		uuid, int64(generation), claim, ts(until), ts(now))
	if err != nil {
		return fmt.Errorf("claim config release of %s: %w", uuid, wrap(err))
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var n int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM config_releases WHERE uuid = $1`, uuid).Scan(&n); err != nil {
		return fmt.Errorf("claim config release of %s: %w", uuid, wrap(err))
	}
	if n == 0 {
		return fmt.Errorf("claim config release of %s: %w", uuid, store.ErrNotFound)
	}
	return fmt.Errorf("claim config release of %s: %w", uuid, store.ErrConflict)
}

// UnclaimConfigRelease makes a claimed release ready again.
func (d *DB) UnclaimConfigRelease(ctx context.Context, uuid string, generation uint64, claim string) error {
	return d.changeRelease(ctx, "unclaim config release", uuid, `UPDATE config_releases SET state = 'ready', claim_id = '', claimed_until = NULL
		WHERE uuid = $1 AND generation = $2 AND state = 'claimed' AND claim_id = $3`, uuid, int64(generation), claim)
}

// BurnConfigRelease marks a claimed release delivered.
func (d *DB) BurnConfigRelease(ctx context.Context, uuid string, generation uint64, claim string, now time.Time) error {
	return d.changeRelease(ctx, "burn config release", uuid, `UPDATE config_releases SET state = 'burned', claim_id = '', claimed_until = NULL,
		burned_at = $4, sealed = ''::bytea
		WHERE uuid = $1 AND generation = $2 AND state = 'claimed' AND claim_id = $3`, uuid, int64(generation), claim, ts(now))
}

// SettleActivation records how a burned release's activation ended.
func (d *DB) SettleActivation(ctx context.Context, uuid string, generation uint64, outcome string, now time.Time) error {
	if outcome == "" {
		return errors.New("settle activation: no outcome")
	}
	return d.changeRelease(ctx, "settle activation", uuid, `UPDATE config_releases SET activation = $3, activated_at = $4
		WHERE uuid = $1 AND generation = $2 AND state = 'burned' AND activation = ''`, uuid, int64(generation), outcome, ts(now))
}

// FailActivation records a failed activation attempt.
func (d *DB) FailActivation(ctx context.Context, uuid string, generation uint64, reason string) error {
	return d.changeRelease(ctx, "record failed activation", uuid, `UPDATE config_releases SET activation_attempts = activation_attempts + 1,
		activation_error = $3 WHERE uuid = $1 AND generation = $2 AND state = 'burned' AND activation = ''`, uuid, int64(generation), reason)
}

// changeRelease runs a conditional update of one release: ErrConflict when
// it changed no row.
func (d *DB) changeRelease(ctx context.Context, what, uuid, sql string, vals ...any) error {
	tag, err := d.pool.Exec(ctx, sql, vals...)
	if err != nil {
		return fmt.Errorf("%s of %s: %w", what, uuid, wrap(err))
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("%s of %s: %w", what, uuid, store.ErrConflict)
	}
	return nil
}

// ListUnsettledReleases returns burned releases whose activation is not
// settled, burned longest ago first.
func (d *DB) ListUnsettledReleases(ctx context.Context, limit int) ([]store.ConfigRelease, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list unsettled releases: limit %d is not positive", limit)
	}
	rows, err := d.pool.Query(ctx, `SELECT `+releaseColumns+` FROM config_releases
		WHERE state = 'burned' AND activation = '' ORDER BY burned_at, uuid LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list unsettled releases: %w", wrap(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.ConfigRelease, error) { return scanRelease(r) })
	if err != nil {
		return nil, fmt.Errorf("list unsettled releases: %w", wrap(err))
	}
	return out, nil
}

// PurgeExpiredReleases drops the sealed configs of expired releases.
func (d *DB) PurgeExpiredReleases(ctx context.Context, now time.Time) (int, error) {
	tag, err := d.pool.Exec(ctx, `UPDATE config_releases SET sealed = ''::bytea
		WHERE state <> 'burned' AND expires_at <= $1 AND length(sealed) > 0`, ts(now))
	if err != nil {
		return 0, fmt.Errorf("purge expired releases: %w", wrap(err))
	}
	return int(tag.RowsAffected()), nil
}

func scanRelease(r pgx.Row) (store.ConfigRelease, error) {
	var (
		c                                        store.ConfigRelease
		gen                                      int64
		created, expires, until, burned, settled *time.Time
	)
	if err := r.Scan(&c.UUID, &c.NodeID, &gen, &c.Verifier, &c.Sealed, &c.ContentType, &created, &expires, &c.State, &c.ClaimID,
		&until, &burned, &c.Activation, &settled, &c.ActivationAttempts, &c.ActivationError); err != nil {
		return store.ConfigRelease{}, err
	}
	c.Generation = uint64(gen)
	c.CreatedAt, c.ExpiresAt, c.ClaimedUntil, c.BurnedAt, c.ActivatedAt = fromTS(created), fromTS(expires), fromTS(until), fromTS(burned), fromTS(settled)
	if len(c.Sealed) == 0 {
		c.Sealed = nil
	}
	return c, nil
}
