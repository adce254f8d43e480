package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const certColumns = `serial, node_id, generation, kind, issued_at, not_after, revoked_at, revoked_reason`

// insertCert records a certificate; ErrConflict if its serial exists.
func insertCert(ctx context.Context, tx pgx.Tx, c store.Cert, g int64) error {
	tag, err := tx.Exec(ctx, `INSERT INTO certs (`+certColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT DO NOTHING`, c.Serial, c.NodeID, g, c.Kind, ts(c.IssuedAt), ts(c.NotAfter), ts(c.RevokedAt), c.RevokedReason)
	if err != nil {
		return fmt.Errorf("record certificate %s: %w", c.Serial, err)
	}
	return mustChange(tag, fmt.Errorf("certificate %s exists: %w", c.Serial, store.ErrConflict))
}

// RecordRenewal stores a renewed certificate and sets the node's current
// serial, expiry and last-seen time, only if the node exists, its
// generation still equals c.Generation and it is active (ErrConflict
// otherwise, and when the serial exists). The UPDATE takes the node's row lock, so a renewal and a
// revocation of one node, on any replicas, happen one after the other.
func (d *DB) RecordRenewal(ctx context.Context, c store.Cert, audit *store.AuditEvent) error {
	return d.recordRenewal(ctx, c, nil, audit)
}

// RecordRenewalLimited is RecordRenewal under the node's renewal limit.
// The transaction updates the node's row first, which locks it until the
// transaction ends: a concurrent renewal of the node, on any replica,
// waits at its own UPDATE, and then (READ COMMITTED: each statement sees
// what committed before it began) counts this one. Over the limit nothing
// is written and the error is a *store.RenewalLimitError; a node that
// changed is ErrConflict first.
func (d *DB) RecordRenewalLimited(ctx context.Context, c store.Cert, limit store.RenewalLimit, audit *store.AuditEvent) error {
	if err := limit.Check(); err != nil {
		return fmt.Errorf("record renewal %s of node %q: %w", c.Serial, c.NodeID, err)
	}
	if c.IssuedAt.IsZero() {
		return fmt.Errorf("record renewal %s of node %q: a renewal under a limit needs its issue time", c.Serial, c.NodeID)
	}
	return d.recordRenewal(ctx, c, &limit, audit)
}

func (d *DB) recordRenewal(ctx context.Context, c store.Cert, limit *store.RenewalLimit, audit *store.AuditEvent) error {
	if c.Serial == "" || c.NodeID == "" {
		return fmt.Errorf("record renewal %s of node %q: certificate has no serial or no node", c.Serial, c.NodeID)
	}
	g, err := gen(c.Generation)
	if err != nil {
		return fmt.Errorf("record renewal %s of node %q: %w", c.Serial, c.NodeID, err)
	}
	err = d.tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE nodes SET cert_serial = $1, cert_not_after = $2, last_seen = $3
			WHERE id = $4 AND generation = $5 AND state = 'active'`, c.Serial, ts(c.NotAfter), ts(c.IssuedAt), c.NodeID, g)
		if err != nil {
			return fmt.Errorf("update node: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return renewalConflict(ctx, tx, c)
		}
		if limit != nil {
			if err := checkRenewalLimit(ctx, tx, c, *limit); err != nil {
				return err
			}
		}
		if err := insertCert(ctx, tx, c, g); err != nil {
			return err
		}
		return insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return fmt.Errorf("record renewal %s of node %q: %w", c.Serial, c.NodeID, err)
	}
	return nil
}

// checkRenewalLimit counts the node's renewals in the window ending at
// c.IssuedAt, in tx, which holds the node's row; a
// *store.RenewalLimitError when there is no room for one more.
func checkRenewalLimit(ctx context.Context, tx pgx.Tx, c store.Cert, limit store.RenewalLimit) error {
	rows, err := tx.Query(ctx, `SELECT issued_at FROM certs
		WHERE node_id = $1 AND kind = 'renew' AND issued_at >= $2
		ORDER BY issued_at, serial`, c.NodeID, c.IssuedAt.Add(-limit.Window).UTC())
	if err != nil {
		return fmt.Errorf("count renewals: %w", err)
	}
	times, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (time.Time, error) {
		var t time.Time
		err := r.Scan(&t)
		return t.UTC(), err
	})
	if err != nil {
		return fmt.Errorf("count renewals: %w", err)
	}
	if over := store.OverRenewalLimit(c.NodeID, times, limit); over != nil {
		return over
	}
	return nil
}

// renewalConflict says why a renewal found no node of its generation.
func renewalConflict(ctx context.Context, tx pgx.Tx, c store.Cert) error {
	var (
		g     int64
		state string
	)
	err := tx.QueryRow(ctx, `SELECT generation, state FROM nodes WHERE id = $1`, c.NodeID).Scan(&g, &state)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("node is gone: %w", store.ErrConflict)
	case err != nil:
		return err
	case g < 0 || uint64(g) != c.Generation:
		return fmt.Errorf("node is at generation %d, certificate has %d: %w", g, c.Generation, store.ErrConflict)
	default:
		return fmt.Errorf("node is %s and does not renew: %w", state, store.ErrConflict)
	}
}

// GetCert returns one issued certificate by serial; ErrNotFound if none.
func (d *DB) GetCert(ctx context.Context, serial string) (store.Cert, error) {
	var (
		c                         store.Cert
		g                         int64
		issued, notAfter, revoked *time.Time
	)
	err := d.pool.QueryRow(ctx, `SELECT `+certColumns+` FROM certs WHERE serial = $1`, serial).
		Scan(&c.Serial, &c.NodeID, &g, &c.Kind, &issued, &notAfter, &revoked, &c.RevokedReason)
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Cert{}, fmt.Errorf("get certificate %s: %w", serial, wrap(err))
	}
	c.Generation = uint64(g)
	c.IssuedAt, c.NotAfter, c.RevokedAt = fromTS(issued), fromTS(notAfter), fromTS(revoked)
	return c, nil
}

// CountCerts counts the certificates of a node issued at or after since,
// revoked or not. A zero since counts them all.
func (d *DB) CountCerts(ctx context.Context, nodeID string, since time.Time) (int, error) {
	var n int
	err := d.pool.QueryRow(ctx, `SELECT count(*) FROM certs
		WHERE node_id = $1 AND ($2::timestamptz IS NULL OR issued_at >= $2)`, nodeID, ts(since)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count certificates of node %q: %w", nodeID, wrap(err))
	}
	return n, nil
}

// RenewalTimes returns the IssuedAt times of the node's certificates of
// kind "renew" issued at or after since, revoked or not, oldest first.
func (d *DB) RenewalTimes(ctx context.Context, nodeID string, since time.Time) ([]time.Time, error) {
	rows, err := d.pool.Query(ctx, `SELECT issued_at FROM certs
		WHERE node_id = $1 AND kind = 'renew' AND ($2::timestamptz IS NULL OR issued_at >= $2)
		ORDER BY issued_at NULLS FIRST, serial`, nodeID, ts(since))
	if err != nil {
		return nil, fmt.Errorf("renewal times of node %q: %w", nodeID, wrap(err))
	}
	times, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (time.Time, error) {
		var t *time.Time
		err := r.Scan(&t)
		return fromTS(t), err
	})
	if err != nil {
		return nil, fmt.Errorf("renewal times of node %q: %w", nodeID, wrap(err))
	}
	return times, nil
}

// ListCerts returns at most limit certificates of the node, of every
// generation, revoked or not, newest first; none for an unknown node. The
// certs_node_issued index serves it.
func (d *DB) ListCerts(ctx context.Context, nodeID string, limit int) ([]store.Cert, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list certificates of node %q: limit %d is not positive", nodeID, limit)
	}
	rows, err := d.pool.Query(ctx, `SELECT `+certColumns+` FROM certs
		WHERE node_id = $1 ORDER BY issued_at DESC NULLS LAST, serial DESC LIMIT $2`, nodeID, limit)
	if err != nil {
		return nil, fmt.Errorf("list certificates of node %q: %w", nodeID, wrap(err))
	}
	certs, err := pgx.CollectRows(rows, scanCert)
	if err != nil {
		return nil, fmt.Errorf("list certificates of node %q: %w", nodeID, wrap(err))
	}
	return certs, nil
}

// scanCert reads one row of certColumns.
func scanCert(r pgx.CollectableRow) (store.Cert, error) {
	var (
		c                         store.Cert
		g                         int64
		issued, notAfter, revoked *time.Time
	)
	err := r.Scan(&c.Serial, &c.NodeID, &g, &c.Kind, &issued, &notAfter, &revoked, &c.RevokedReason)
	c.Generation = uint64(g)
	c.IssuedAt, c.NotAfter, c.RevokedAt = fromTS(issued), fromTS(notAfter), fromTS(revoked)
	return c, err
}
