package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nodetrust/nodetrust/store"
)

// nodeColumns reads a node row n; the claimed serials come from
// node_serials as a JSON array in claim order.
const nodeColumns = `n.id, n.spiffe_id, n.role, n.site, n.state, n.generation, n.attestor,
	n.product_uuid,
	(SELECT json_group_array(s.serial ORDER BY s.pos) FROM node_serials s WHERE s.node_id = n.id),
	n.macs, n.gpu_uuids, n.hostname, n.boot_id, n.daemon_version,
	n.joined_at, n.last_seen, n.cert_serial, n.cert_not_after`

// CompleteJoin removes the pending join j.PendingID (if any), spends the
// token (if any), writes the node and records the certificate in one
// transaction. It fails with ErrConflict, writing nothing, when there is
// no pending join j.PendingID, when it is not approved, or when it was made
// for another node id or another token hash than the join's; when the
// token is unknown, used or expired at j.Now; when j.Reclaim is false and
// the node id exists; or when the certificate's serial exists. Whether an
// approved pending join has expired is the caller's to check. A reclaim replaces the stored node if there is one (and
// writes it if there is none), revoking the old node's unrevoked
// certificates with reason "reclaimed" at j.Now. The certificate must name
// the node and its generation.
func (d *DB) CompleteJoin(ctx context.Context, j store.Join) error {
	n, c := j.Node, j.Cert
	switch {
	case n.ID == "":
		return errors.New("complete join: node has no id")
	case c.Serial == "":
		return fmt.Errorf("complete join for node %q: certificate has no serial", n.ID)
	case c.NodeID != n.ID:
		return fmt.Errorf("complete join for node %q: certificate %s names node %q", n.ID, c.Serial, c.NodeID)
	case c.Generation != n.Generation:
		return fmt.Errorf("complete join for node %q: certificate %s has generation %d, node has %d",
			n.ID, c.Serial, c.Generation, n.Generation)
	case j.Now.IsZero():
		return fmt.Errorf("complete join for node %q: no time given", n.ID)
	}
	var a args
	now := a.time(j.Now)
	nodeVals := nodeArgs(&a, n)
	certVals := certArgs(&a, c)
	if a.err != nil {
		return fmt.Errorf("complete join for node %q: %w", n.ID, a.err)
	}
	err := d.write(ctx, func(tx *sql.Tx) error {
		if j.PendingID != "" {
			if err := takePending(ctx, tx, j.PendingID, n.ID, j.TokenHash); err != nil {
				return err
			}
		}
		if j.TokenHash != nil {
			if err := spendToken(ctx, tx, j.TokenHash, n.ID, now); err != nil {
				return err
			}
		}
		if j.Reclaim {
			if _, err := tx.ExecContext(ctx, `UPDATE certs SET revoked_at = ?, revoked_reason = 'reclaimed'
				WHERE node_id = ? AND revoked_at IS NULL`, now, n.ID); err != nil {
				return fmt.Errorf("revoke certificates of the reclaimed node: %w", err)
			}
		}
		if err := putNode(ctx, tx, nodeVals, j.Reclaim); err != nil {
			return err
		}
		if err := putSerials(ctx, tx, n.ID, n.Claims.Serials); err != nil {
			return err
		}
		return insertCert(ctx, tx, c.Serial, certVals)
	})
	if err != nil {
		return fmt.Errorf("complete join for node %q: %w", n.ID, err)
	}
	return nil
}

func nodeArgs(a *args, n store.Node) []any {
	return []any{n.ID, n.SPIFFEID, n.Role, n.Site, n.State, a.gen(n.Generation), n.Attestor,
		n.Claims.ProductUUID, a.list(n.Claims.MACs), a.list(n.Claims.GPUUUIDs),
		n.Claims.Hostname, n.Claims.BootID, n.DaemonVersion,
		a.time(n.JoinedAt), a.time(n.LastSeen), n.CertSerial, a.time(n.CertNotAfter)}
}

// putNode inserts the node row, or with replace overwrites the one with the
// same id. Without replace an existing id is an ErrConflict.
func putNode(ctx context.Context, tx *sql.Tx, vals []any, replace bool) error {
	q := `INSERT INTO nodes (id, spiffe_id, role, site, state, generation, attestor,
			product_uuid, macs, gpu_uuids, hostname, boot_id, daemon_version,
			joined_at, last_seen, cert_serial, cert_not_after)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	if replace {
		q += ` ON CONFLICT (id) DO UPDATE SET spiffe_id = excluded.spiffe_id, role = excluded.role,
			site = excluded.site, state = excluded.state, generation = excluded.generation,
			attestor = excluded.attestor, product_uuid = excluded.product_uuid,
			macs = excluded.macs, gpu_uuids = excluded.gpu_uuids, hostname = excluded.hostname,
			boot_id = excluded.boot_id, daemon_version = excluded.daemon_version,
			joined_at = excluded.joined_at, last_seen = excluded.last_seen,
			cert_serial = excluded.cert_serial, cert_not_after = excluded.cert_not_after`
	} else {
		q += ` ON CONFLICT (id) DO NOTHING`
	}
	res, err := tx.ExecContext(ctx, q, vals...)
	if err != nil {
		return fmt.Errorf("write node: %w", err)
	}
	return mustChange(res, fmt.Errorf("node exists: %w", store.ErrConflict))
}

// putSerials replaces the node's claimed serials.
func putSerials(ctx context.Context, tx *sql.Tx, id string, serials []string) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM node_serials WHERE node_id = ?`, id); err != nil {
		return fmt.Errorf("write serials: %w", err)
	}
	for i, s := range serials {
		if _, err := tx.ExecContext(ctx, `INSERT INTO node_serials (node_id, pos, serial) VALUES (?, ?, ?)`,
			id, i, s); err != nil {
			return fmt.Errorf("write serials: %w", err)
		}
	}
	return nil
}

// GetNode returns one node; ErrNotFound if there is none.
func (d *DB) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := scanNode(d.r.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes n WHERE n.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Node{}, fmt.Errorf("get node %q: %w", id, err)
	}
	return n, nil
}

// ListNodes returns all nodes ordered by id.
func (d *DB) ListNodes(ctx context.Context) ([]store.Node, error) {
	ns, err := d.queryNodes(ctx, `SELECT `+nodeColumns+` FROM nodes n ORDER BY n.id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return ns, nil
}

// NodesByClaims returns the nodes, ordered by id, whose stored product UUID
// equals productUUID (when not empty) or whose claimed serials share one
// with serials. Empty strings in serials match nothing. Comparisons are
// exact (case-sensitive).
func (d *DB) NodesByClaims(ctx context.Context, productUUID string, serials []string) ([]store.Node, error) {
	serials = slices.DeleteFunc(slices.Clone(serials), func(s string) bool { return s == "" })
	if productUUID == "" && len(serials) == 0 {
		return nil, nil
	}
	var a args
	list := a.list(serials)
	if a.err != nil {
		return nil, fmt.Errorf("find nodes by claims: %w", a.err)
	}
	ns, err := d.queryNodes(ctx, `SELECT `+nodeColumns+` FROM nodes n
		WHERE n.id IN (
			SELECT id FROM nodes WHERE ?1 <> '' AND product_uuid = ?1
			UNION
			SELECT node_id FROM node_serials WHERE serial IN (SELECT value FROM json_each(?2)))
		ORDER BY n.id`, productUUID, list)
	if err != nil {
		return nil, fmt.Errorf("find nodes by claims: %w", err)
	}
	return ns, nil
}

func (d *DB) queryNodes(ctx context.Context, q string, vals ...any) ([]store.Node, error) {
	rows, err := d.r.QueryContext(ctx, q, vals...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ns []store.Node
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, err
		}
		ns = append(ns, n)
	}
	return ns, rows.Err()
}

func scanNode(s scanner) (store.Node, error) {
	var (
		n                              store.Node
		gen                            int64
		serials, macs, gpus            string
		joined, lastSeen, certNotAfter sql.NullInt64
	)
	if err := s.Scan(&n.ID, &n.SPIFFEID, &n.Role, &n.Site, &n.State, &gen, &n.Attestor,
		&n.Claims.ProductUUID, &serials, &macs, &gpus, &n.Claims.Hostname, &n.Claims.BootID,
		&n.DaemonVersion, &joined, &lastSeen, &n.CertSerial, &certNotAfter); err != nil {
		return store.Node{}, err
	}
	var err error
	if n.Claims.Serials, err = fromList(serials); err != nil {
		return store.Node{}, fmt.Errorf("node %q serials: %w", n.ID, err)
	}
	if n.Claims.MACs, err = fromList(macs); err != nil {
		return store.Node{}, fmt.Errorf("node %q macs: %w", n.ID, err)
	}
	if n.Claims.GPUUUIDs, err = fromList(gpus); err != nil {
		return store.Node{}, fmt.Errorf("node %q gpu uuids: %w", n.ID, err)
	}
	n.Generation = uint64(gen)
	n.JoinedAt, n.LastSeen, n.CertNotAfter = fromNanos(joined), fromNanos(lastSeen), fromNanos(certNotAfter)
	return n, nil
}

// RevokeNode raises the node's generation, sets its state to StateRevoked
// and marks all its unrevoked certificates revoked with reason at now. It
// returns the new generation and the revoked serials in ascending order;
// ErrNotFound if there is no such node.
func (d *DB) RevokeNode(ctx context.Context, id, reason string, now time.Time) (uint64, []string, error) {
	var (
		gen     uint64
		serials []string
	)
	err := d.write(ctx, func(tx *sql.Tx) (err error) {
		gen, serials, err = revoke(ctx, tx, id, reason, now)
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("revoke node %q: %w", id, err)
	}
	return gen, serials, nil
}

// DeleteNode revokes as RevokeNode does, then removes the node record and
// its claims; its certificate records stay, revoked. It returns the
// revoked serials; ErrNotFound if there is no such node.
func (d *DB) DeleteNode(ctx context.Context, id, reason string, now time.Time) ([]string, error) {
	var serials []string
	err := d.write(ctx, func(tx *sql.Tx) (err error) {
		if _, serials, err = revoke(ctx, tx, id, reason, now); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM nodes WHERE id = ?`, id); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delete node %q: %w", id, err)
	}
	return serials, nil
}

func revoke(ctx context.Context, tx *sql.Tx, id, reason string, now time.Time) (uint64, []string, error) {
	var a args
	at := a.time(now)
	if a.err != nil {
		return 0, nil, a.err
	}
	if !at.Valid {
		return 0, nil, errors.New("no time given")
	}
	var gen int64
	err := tx.QueryRowContext(ctx, `UPDATE nodes SET generation = generation + 1, state = ?
		WHERE id = ? RETURNING generation`, store.StateRevoked, id).Scan(&gen)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil, store.ErrNotFound
	}
	if err != nil {
		return 0, nil, fmt.Errorf("raise generation: %w", err)
	}
	rows, err := tx.QueryContext(ctx, `UPDATE certs SET revoked_at = ?, revoked_reason = ?
		WHERE node_id = ? AND revoked_at IS NULL RETURNING serial`, at, reason, id)
	if err != nil {
		return 0, nil, fmt.Errorf("revoke certificates: %w", err)
	}
	defer rows.Close()
	var serials []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return 0, nil, fmt.Errorf("revoke certificates: %w", err)
		}
		serials = append(serials, s)
	}
	if err := rows.Err(); err != nil {
		return 0, nil, fmt.Errorf("revoke certificates: %w", err)
	}
	slices.Sort(serials)
	return uint64(gen), serials, nil
}
