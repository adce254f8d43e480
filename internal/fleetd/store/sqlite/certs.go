package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const certColumns = `serial, node_id, generation, kind, issued_at, not_after, revoked_at, revoked_reason`

var (
	qInsertCert = newWriteQuery(`INSERT INTO certs (` + certColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`)
	qRenewNode = newWriteQuery(`UPDATE nodes SET cert_serial = ?, cert_not_after = ?, last_seen = ?
		WHERE id = ? AND generation = ? AND state = 'active'`)
	qNodeGeneration = newWriteQuery(`SELECT generation, state FROM nodes WHERE id = ?`)
	qGetCert        = newReadQuery(`SELECT ` + certColumns + ` FROM certs WHERE serial = ?`)
	qCountCerts     = newReadQuery(`SELECT count(*) FROM certs
		WHERE node_id = ?1 AND (?2 IS NULL OR issued_at >= ?2)`)
	// qListCerts walks the certs_node_issued index backwards.
	qListCerts = newReadQuery(`SELECT ` + certColumns + ` FROM certs
		WHERE node_id = ? ORDER BY issued_at DESC, serial DESC LIMIT ?`)
	qRenewalTimes = newReadQuery(`SELECT issued_at FROM certs
		WHERE node_id = ?1 AND kind = 'renew' AND (?2 IS NULL OR issued_at >= ?2)
		ORDER BY issued_at NULLS FIRST, serial`)
	// qRenewalTimesW is qRenewalTimes in a write transaction, where it
	// sees the renewals written before it by the same transaction.
	qRenewalTimesW = newWriteQuery(`SELECT issued_at FROM certs
		WHERE node_id = ?1 AND kind = 'renew' AND issued_at >= ?2
		ORDER BY issued_at, serial`)
	// qRenewalCountW counts what qRenewalTimesW would return: a renewal
	// under its limit needs no more, and one row costs less than many.
	qRenewalCountW = newWriteQuery(`SELECT count(*) FROM certs
		WHERE node_id = ?1 AND kind = 'renew' AND issued_at >= ?2`)
)

func certArgs(a *args, c store.Cert) []any {
	return []any{c.Serial, c.NodeID, a.gen(c.Generation), c.Kind,
		a.time(c.IssuedAt), a.time(c.NotAfter), a.time(c.RevokedAt), c.RevokedReason}
}

// insertCert records a certificate; ErrConflict if its serial exists.
func insertCert(t *wtx, serial string, vals []any) error {
	res, err := t.exec(qInsertCert, vals...)
	if err != nil {
		return fmt.Errorf("record certificate %s: %w", serial, err)
	}
	return mustChange(res, fmt.Errorf("certificate %s exists: %w", serial, store.ErrConflict))
}

// RecordRenewal stores a renewed certificate and sets the node's current
// serial to c.Serial, its expiry to c.NotAfter and its last-seen time to
// c.IssuedAt, only if the node exists, its generation still equals
// c.Generation and it is active (a quarantined, retired, revoked, planned or
// provisioning node does not renew). It returns ErrConflict otherwise, and when
// the serial
// exists. The audit event, when not nil, is appended in the same
// transaction, so it is written if and only if the renewal is.
//
// Concurrent RecordRenewal and CompleteJoin calls share transactions (see
// batch.go): each returns once the transaction that holds its renewal has
// committed, or with the error that kept its renewal out.
func (d *DB) RecordRenewal(ctx context.Context, c store.Cert, audit *store.AuditEvent) error {
	return d.recordRenewal(ctx, c, nil, audit)
}

// RecordRenewalLimited is RecordRenewal under the node's renewal limit:
// the renewals are counted in the write transaction that writes this one,
// on the single writer connection, after the node's row was updated, so
// that a renewal counts every one committed or batched before it and
// none can pass the limit alongside. Over the limit it writes nothing
// and returns a *store.RenewalLimitError; a node that changed is
// ErrConflict first.
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
	var a args
	call := &renewalCall{
		c:         c,
		limit:     limit,
		gen:       a.gen(c.Generation),
		notAfter:  a.time(c.NotAfter),
		issued:    a.time(c.IssuedAt),
		certVals:  certArgs(&a, c),
		auditVals: auditArgs(&a, audit),
	}
	if limit != nil {
		call.since = a.time(c.IssuedAt.Add(-limit.Window))
	}
	if a.err != nil {
		return fmt.Errorf("record renewal %s of node %q: %w", c.Serial, c.NodeID, a.err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("record renewal %s of node %q: %w", c.Serial, c.NodeID, err)
	}
	if err := d.batched(ctx, call); err != nil {
		return fmt.Errorf("record renewal %s of node %q: %w", c.Serial, c.NodeID, err)
	}
	return nil
}

// renewalCall is the op of one RecordRenewal call: its certificate with
// the column values already converted.
type renewalCall struct {
	c store.Cert
	// limit, when not nil, is the renewal limit counted from since.
	limit                   *store.RenewalLimit
	gen                     int64
	notAfter, issued, since sql.NullInt64
	certVals, auditVals     []any
}

func (call *renewalCall) String() string {
	return fmt.Sprintf("renewal %s of node %q", call.c.Serial, call.c.NodeID)
}

// write writes the renewal of call in t: everything RecordRenewal writes.
func (call *renewalCall) write(t *wtx) error {
	c := &call.c
	res, err := t.exec(qRenewNode, c.Serial, call.notAfter, call.issued, c.NodeID, call.gen)
	if err != nil {
		return fmt.Errorf("update node: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return renewalConflict(t, *c)
	}
	if call.limit != nil {
		// The node's row is written: no other renewal of it can be
		// counted or written until this transaction ends.
		if err := call.checkLimit(t); err != nil {
			return err
		}
	}
	if err := insertCert(t, c.Serial, call.certVals); err != nil {
		return err
	}
	return insertAudit(t, call.auditVals)
}

// checkLimit counts the node's renewals in the window ending at the
// renewal's IssuedAt, in t; a *store.RenewalLimitError when there is no
// room for one more. Only a node at its limit has its renewal times read,
// for the time the next renewal may pass.
func (call *renewalCall) checkLimit(t *wtx) error {
	var n int
	if err := t.queryRow(qRenewalCountW, call.c.NodeID, call.since).Scan(&n); err != nil {
		return fmt.Errorf("count renewals: %w", err)
	}
	if n < call.limit.Max {
		return nil
	}
	rows, err := t.query(qRenewalTimesW, call.c.NodeID, call.since)
	if err != nil {
		return fmt.Errorf("count renewals: %w", err)
	}
	defer rows.Close()
	var times []time.Time
	for rows.Next() {
		var issued sql.NullInt64
		if err := rows.Scan(&issued); err != nil {
			return fmt.Errorf("count renewals: %w", err)
		}
		times = append(times, fromNanos(issued))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("count renewals: %w", err)
	}
	if over := store.OverRenewalLimit(call.c.NodeID, times, *call.limit); over != nil {
		return over
	}
	return nil
}

// renewalConflict says why a renewal found no node of its generation.
func renewalConflict(t *wtx, c store.Cert) error {
	var (
		gen   int64
		state string
	)
	err := t.queryRow(qNodeGeneration, c.NodeID).Scan(&gen, &state)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("node is gone: %w", store.ErrConflict)
	case err != nil:
		return err
	case gen < 0 || uint64(gen) != c.Generation:
		return fmt.Errorf("node is at generation %d, certificate has %d: %w", gen, c.Generation, store.ErrConflict)
	default:
		return fmt.Errorf("node is %s and does not renew: %w", state, store.ErrConflict)
	}
}

// GetCert returns one issued certificate by serial; ErrNotFound if there is
// none.
func (d *DB) GetCert(ctx context.Context, serial string) (store.Cert, error) {
	var (
		c                         store.Cert
		gen                       int64
		issued, notAfter, revoked sql.NullInt64
	)
	err := d.queryRow(ctx, qGetCert, serial).
		Scan(&c.Serial, &c.NodeID, &gen, &c.Kind, &issued, &notAfter, &revoked, &c.RevokedReason)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Cert{}, fmt.Errorf("get certificate %s: %w", serial, err)
	}
	c.Generation = uint64(gen)
	c.IssuedAt, c.NotAfter, c.RevokedAt = fromNanos(issued), fromNanos(notAfter), fromNanos(revoked)
	return c, nil
}

// CountCerts counts the certificates of a node issued at or after since,
// revoked or not. A zero since counts them all.
func (d *DB) CountCerts(ctx context.Context, nodeID string, since time.Time) (int, error) {
	var a args
	from := a.time(since)
	if a.err != nil {
		return 0, fmt.Errorf("count certificates of node %q: %w", nodeID, a.err)
	}
	var n int
	err := d.queryRow(ctx, qCountCerts, nodeID, from).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count certificates of node %q: %w", nodeID, err)
	}
	return n, nil
}

// RenewalTimes returns the IssuedAt times of the node's certificates of
// kind "renew" issued at or after since, revoked or not, oldest first. A
// zero since returns them all.
func (d *DB) RenewalTimes(ctx context.Context, nodeID string, since time.Time) ([]time.Time, error) {
	var a args
	from := a.time(since)
	if a.err != nil {
		return nil, fmt.Errorf("renewal times of node %q: %w", nodeID, a.err)
	}
	rows, err := d.query(ctx, qRenewalTimes, nodeID, from)
	if err != nil {
		return nil, fmt.Errorf("renewal times of node %q: %w", nodeID, err)
	}
	defer rows.Close()
	var ts []time.Time
	for rows.Next() {
		var issued sql.NullInt64
		if err := rows.Scan(&issued); err != nil {
			return nil, fmt.Errorf("renewal times of node %q: %w", nodeID, err)
		}
		ts = append(ts, fromNanos(issued))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("renewal times of node %q: %w", nodeID, err)
	}
	return ts, nil
}

// ListCerts returns at most limit certificates of the node, of every
// generation, revoked or not, newest first; none for an unknown node.
func (d *DB) ListCerts(ctx context.Context, nodeID string, limit int) ([]store.Cert, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list certificates of node %q: limit %d is not positive", nodeID, limit)
	}
	certs, err := queryAll(ctx, d, scanCert, qListCerts, nodeID, limit)
	if err != nil {
		return nil, fmt.Errorf("list certificates of node %q: %w", nodeID, err)
	}
	return certs, nil
}

// scanCert reads one row of certColumns.
func scanCert(r scanner) (store.Cert, error) {
	var (
		c                         store.Cert
		gen                       int64
		issued, notAfter, revoked sql.NullInt64
	)
	if err := r.Scan(&c.Serial, &c.NodeID, &gen, &c.Kind, &issued, &notAfter, &revoked, &c.RevokedReason); err != nil {
		return store.Cert{}, err
	}
	c.Generation = uint64(gen)
	c.IssuedAt, c.NotAfter, c.RevokedAt = fromNanos(issued), fromNanos(notAfter), fromNanos(revoked)
	return c, nil
}
