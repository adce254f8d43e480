package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const nodeColumns = `id, spiffe_id, role, site, state, generation, attestor,
	product_uuid, serials, macs, gpu_uuids, hostname, boot_id, daemon_version,
	joined_at, last_seen, cert_serial, cert_not_after, ek_pin, class, lak_name`

const nodeInsert = `INSERT INTO nodes (` + nodeColumns + `)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)`

const nodeReplace = nodeInsert + ` ON CONFLICT (id) DO UPDATE SET spiffe_id = excluded.spiffe_id,
	role = excluded.role, site = excluded.site, state = excluded.state,
	generation = excluded.generation, attestor = excluded.attestor,
	product_uuid = excluded.product_uuid, serials = excluded.serials, macs = excluded.macs,
	gpu_uuids = excluded.gpu_uuids, hostname = excluded.hostname, boot_id = excluded.boot_id,
	daemon_version = excluded.daemon_version, joined_at = excluded.joined_at,
	last_seen = excluded.last_seen, cert_serial = excluded.cert_serial,
	cert_not_after = excluded.cert_not_after, ek_pin = excluded.ek_pin, class = excluded.class,
	lak_name = excluded.lak_name`

// CompleteJoin removes the pending join j.PendingID (if any), spends the
// token (if any), writes the node, records the certificate and appends
// j.Audit (if any) in one transaction, with the contract of the SQLite
// store's CompleteJoin: ErrConflict, writing nothing, for an unknown,
// unapproved or mismatched pending join, an unknown, used or expired
// token, an existing node id without Reclaim, an existing serial, and a
// generation at or below a deletion's tombstone. A reclaim revokes the old
// node's unrevoked certificates with reason "reclaimed", and publishes a
// revocation at the new generation for the other replicas' sessions.
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
	g, err := gen(n.Generation)
	if err != nil {
		return fmt.Errorf("complete join for node %q: %w", n.ID, err)
	}
	err = d.tx(ctx, func(tx pgx.Tx) error {
		if err := lockNode(ctx, tx, n.ID); err != nil {
			return err
		}
		if err := checkTombstone(ctx, tx, n.ID, g); err != nil {
			return err
		}
		if j.PendingID != "" {
			if err := takePending(ctx, tx, j.PendingID, n.ID, j.TokenHash); err != nil {
				return err
			}
		}
		if j.TokenHash != nil {
			if err := spendToken(ctx, tx, j.TokenHash, n.ID, j.Now); err != nil {
				return err
			}
		}
		if j.ExpectState != "" {
			if err := expectNode(ctx, tx, n.ID, j.ExpectState, j.ExpectGeneration); err != nil {
				return err
			}
		}
		q := nodeInsert + ` ON CONFLICT (id) DO NOTHING`
		if j.Reclaim {
			if _, err := tx.Exec(ctx, `UPDATE certs SET revoked_at = $1, revoked_reason = 'reclaimed'
				WHERE node_id = $2 AND revoked_at IS NULL`, ts(j.Now), n.ID); err != nil {
				return fmt.Errorf("revoke certificates of the reclaimed node: %w", err)
			}
			// The old identity's live session, on whichever replica holds
			// it, ends as a revocation's does; the new generation's own
			// session is left alone (the listeners end older ones only).
			if err := publishRevocation(ctx, tx, n.ID, g, "reclaimed", j.Now); err != nil {
				return err
			}
			q = nodeReplace
		}
		tag, err := tx.Exec(ctx, q, nodeArgs(n, g)...)
		if err != nil {
			return fmt.Errorf("write node: %w", err)
		}
		if err := mustChange(tag, fmt.Errorf("node exists: %w", store.ErrConflict)); err != nil {
			return err
		}
		if err := insertCert(ctx, tx, c, g); err != nil {
			return err
		}
		for _, h := range j.History {
			if err := insertHistory(ctx, tx, h); err != nil {
				return err
			}
		}
		if j.ClaimKey != "" {
			if _, err := tx.Exec(ctx, `DELETE FROM claims WHERE key = $1`, j.ClaimKey); err != nil {
				return fmt.Errorf("remove claim: %w", err)
			}
		}
		return insertAudit(ctx, tx, j.Audit)
	})
	if err != nil {
		return fmt.Errorf("complete join for node %q: %w", n.ID, err)
	}
	return nil
}

// expectNode refuses, with ErrConflict, unless node id exists with state
// and generation g.
func expectNode(ctx context.Context, tx pgx.Tx, id, state string, g uint64) error {
	var (
		cur string
		cg  int64
	)
	err := tx.QueryRow(ctx, `SELECT state, generation FROM nodes WHERE id = $1`, id).Scan(&cur, &cg)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("node %q is gone: %w", id, store.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("read node state: %w", err)
	}
	if cur != state || cg < 0 || uint64(cg) != g {
		return fmt.Errorf("node %q is %s at generation %d, the join expected %s at %d: %w", id, cur, cg, state, g, store.ErrConflict)
	}
	return nil
}

func nodeArgs(n store.Node, g int64) []any {
	return []any{n.ID, n.SPIFFEID, n.Role, n.Site, n.State, g, n.Attestor,
		n.Claims.ProductUUID, list(n.Claims.Serials), list(n.Claims.MACs), list(n.Claims.GPUUUIDs),
		n.Claims.Hostname, n.Claims.BootID, n.DaemonVersion,
		ts(n.JoinedAt), ts(n.LastSeen), n.CertSerial, ts(n.CertNotAfter), n.EKPin, n.Class, lakName(n.LAKName)}
}

// checkTombstone refuses, with ErrConflict, a node id a deletion left a
// tombstone for at generation g or above.
func checkTombstone(ctx context.Context, tx pgx.Tx, id string, g int64) error {
	var dead int64
	err := tx.QueryRow(ctx, `SELECT generation FROM node_tombstones WHERE id = $1`, id).Scan(&dead)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read tombstone: %w", err)
	}
	if g <= dead {
		return fmt.Errorf("node %q was deleted at generation %d, the join is at generation %d: %w",
			id, dead, g, store.ErrConflict)
	}
	return nil
}

// takePending removes the pending join id that the join of node nodeID
// spending the token tokenHash completes; ErrConflict when there is no
// such pending join, it is not approved, or it was made for another node
// or token.
func takePending(ctx context.Context, tx pgx.Tx, id, nodeID string, tokenHash []byte) error {
	var (
		approved  *time.Time
		node      string
		pendToken []byte
	)
	err := tx.QueryRow(ctx, `DELETE FROM pending_joins WHERE id = $1
		RETURNING approved_at, node_id, token_hash`, id).Scan(&approved, &node, &pendToken)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("no pending join %q: %w", id, store.ErrConflict)
	case err != nil:
		return fmt.Errorf("remove pending join %q: %w", id, err)
	case approved == nil:
		return fmt.Errorf("pending join %q is not approved: %w", id, store.ErrConflict)
	case node != nodeID:
		return fmt.Errorf("pending join %q is for node %q: %w", id, node, store.ErrConflict)
	case !bytes.Equal(pendToken, tokenHash):
		return fmt.Errorf("pending join %q was made with another token: %w", id, store.ErrConflict)
	}
	return nil
}

// NextGeneration returns the generation a new node with this id must start
// at: one more than the generation of its live row or of its tombstone,
// whichever is higher; 1 for an id never seen.
func (d *DB) NextGeneration(ctx context.Context, id string) (uint64, error) {
	var last int64
	err := d.pool.QueryRow(ctx, `SELECT greatest(
		coalesce((SELECT generation FROM nodes WHERE id = $1), 0),
		coalesce((SELECT generation FROM node_tombstones WHERE id = $1), 0))`, id).Scan(&last)
	if err != nil {
		return 0, fmt.Errorf("next generation of node %q: %w", id, wrap(err))
	}
	if last < 0 || last == 1<<63-1 {
		return 0, fmt.Errorf("next generation of node %q: generation %d leaves no next one", id, last)
	}
	return uint64(last) + 1, nil
}

// GetNode returns one node; ErrNotFound if there is none.
func (d *DB) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := scanNode(d.pool.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Node{}, fmt.Errorf("get node %q: %w", id, wrap(err))
	}
	return n, nil
}

// NodeByEKPin returns the node whose tpm join proved the EK with this pin,
// one that is not retired when there is one; ErrNotFound if none did.
func (d *DB) NodeByEKPin(ctx context.Context, pin string) (store.Node, error) {
	if pin == "" {
		return store.Node{}, fmt.Errorf("node by EK pin: empty pin: %w", store.ErrNotFound)
	}
	n, err := scanNode(d.pool.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes
		WHERE ek_pin = $1 AND ek_pin <> '' ORDER BY state = 'retired', id LIMIT 1`, pin))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Node{}, fmt.Errorf("node with EK %s: %w", pin, store.ErrNotFound)
	}
	if err != nil {
		return store.Node{}, fmt.Errorf("node by EK pin: %w", wrap(err))
	}
	return n, nil
}

// ListNodes returns all nodes ordered by id.
func (d *DB) ListNodes(ctx context.Context) ([]store.Node, error) {
	ns, err := d.queryNodes(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return ns, nil
}

// NodesByClaims returns the nodes, ordered by id, whose stored product UUID
// equals productUUID (when not empty) or whose claimed serials share one
// with serials. Empty strings match nothing; comparisons are exact.
func (d *DB) NodesByClaims(ctx context.Context, productUUID string, serials []string) ([]store.Node, error) {
	serials = slices.DeleteFunc(slices.Clone(serials), func(s string) bool { return s == "" })
	if productUUID == "" && len(serials) == 0 {
		return nil, nil
	}
	ns, err := d.queryNodes(ctx, `SELECT `+nodeColumns+` FROM nodes
		WHERE ($1 <> '' AND product_uuid = $1) OR serials && $2 ORDER BY id`, productUUID, list(serials))
	if err != nil {
		return nil, fmt.Errorf("find nodes by claims: %w", err)
	}
	return ns, nil
}

func (d *DB) queryNodes(ctx context.Context, q string, args ...any) ([]store.Node, error) {
	rows, err := d.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, wrap(err)
	}
	ns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Node, error) { return scanNode(r) })
	return ns, wrap(err)
}

func scanNode(s pgx.Row) (store.Node, error) {
	var (
		n                              store.Node
		g                              int64
		joined, lastSeen, certNotAfter *time.Time
	)
	if err := s.Scan(&n.ID, &n.SPIFFEID, &n.Role, &n.Site, &n.State, &g, &n.Attestor,
		&n.Claims.ProductUUID, &n.Claims.Serials, &n.Claims.MACs, &n.Claims.GPUUUIDs,
		&n.Claims.Hostname, &n.Claims.BootID, &n.DaemonVersion,
		&joined, &lastSeen, &n.CertSerial, &certNotAfter, &n.EKPin, &n.Class, &n.LAKName); err != nil {
		return store.Node{}, err
	}
	n.Generation = uint64(g)
	n.Claims.Serials, n.Claims.MACs, n.Claims.GPUUUIDs = fromList(n.Claims.Serials), fromList(n.Claims.MACs), fromList(n.Claims.GPUUUIDs)
	n.JoinedAt, n.LastSeen, n.CertNotAfter = fromTS(joined), fromTS(lastSeen), fromTS(certNotAfter)
	return n, nil
}

// RevokeNode raises the node's generation, sets its state to StateRevoked
// (a quarantined or retired node keeps its state) and marks its unrevoked
// certificates revoked with reason at now. It
// returns the new generation and the revoked serials in ascending order;
// ErrNotFound if there is no such node. The audit event, when not nil, and
// the revocation's row and NOTIFY for the other replicas are written in
// the same transaction.
func (d *DB) RevokeNode(ctx context.Context, id, reason string, now time.Time, audit *store.AuditEvent) (uint64, []string, error) {
	if now.IsZero() {
		return 0, nil, fmt.Errorf("revoke node %q: no time given", id)
	}
	var (
		g       uint64
		serials []string
	)
	err := d.tx(ctx, func(tx pgx.Tx) (err error) {
		if g, serials, err = revoke(ctx, tx, id, reason, now, audit, false); err != nil {
			return err
		}
		return insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("revoke node %q: %w", id, err)
	}
	return g, serials, nil
}

// DeleteNode revokes as RevokeNode does, then removes the node record; its
// certificate records stay, revoked. It leaves (or raises) the id's
// tombstone at the generation it revoked at, and returns that generation.
func (d *DB) DeleteNode(ctx context.Context, id, reason string, now time.Time, audit *store.AuditEvent) (uint64, []string, error) {
	if now.IsZero() {
		return 0, nil, fmt.Errorf("delete node %q: no time given", id)
	}
	var (
		gen     uint64
		serials []string
	)
	err := d.tx(ctx, func(tx pgx.Tx) error {
		g, s, err := revoke(ctx, tx, id, reason, now, audit, false)
		if err != nil {
			return err
		}
		gen, serials = g, s
		if _, err := tx.Exec(ctx, `INSERT INTO node_tombstones (id, generation, deleted_at) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO UPDATE SET generation = greatest(node_tombstones.generation, excluded.generation),
			deleted_at = excluded.deleted_at`, id, int64(g), ts(now)); err != nil {
			return fmt.Errorf("write tombstone: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM nodes WHERE id = $1`, id); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		// A later node of the same id is not captured from the deleted
		// one's boot evidence.
		if _, err := tx.Exec(ctx, `DELETE FROM boot_evidence WHERE node_id = $1`, id); err != nil {
			return fmt.Errorf("delete its boot evidence: %w", err)
		}
		return insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("delete node %q: %w", id, err)
	}
	return gen, serials, nil
}

// revoke raises the generation, revokes the certificates, and records the
// revocation for the other replicas (a row and a NOTIFY, both sent only
// if the transaction commits).
//
// The state becomes revoked unless the node is quarantined, retired or
// planned, which it stays (and with keepState it does not change); a
// change of state goes into the history with audit's actor ("fleetd"
// without one).
func revoke(ctx context.Context, tx pgx.Tx, id, reason string, now time.Time, audit *store.AuditEvent, keepState bool) (uint64, []string, error) {
	if err := lockNode(ctx, tx, id); err != nil {
		return 0, nil, err
	}
	var old string
	err := tx.QueryRow(ctx, `SELECT state FROM nodes WHERE id = $1`, id).Scan(&old)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil, store.ErrNotFound
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read node state: %w", err)
	}
	state := store.StateRevoked
	switch old {
	case store.StateQuarantined, store.StateRetired, store.StatePlanned:
		state = old
	}
	if keepState {
		state = old
	}
	var g int64
	if err := tx.QueryRow(ctx, `UPDATE nodes SET generation = generation + 1, state = $1
		WHERE id = $2 RETURNING generation`, state, id).Scan(&g); err != nil {
		return 0, nil, fmt.Errorf("raise generation: %w", err)
	}
	if state != old {
		h := store.StateChange{Time: now, NodeID: id, From: old, To: state, Actor: "fleetd", Reason: reason}
		if audit != nil {
			h.Actor = audit.Actor
		}
		if err := insertHistory(ctx, tx, h); err != nil {
			return 0, nil, err
		}
	}
	rows, err := tx.Query(ctx, `UPDATE certs SET revoked_at = $1, revoked_reason = $2
		WHERE node_id = $3 AND revoked_at IS NULL RETURNING serial`, ts(now), reason, id)
	if err != nil {
		return 0, nil, fmt.Errorf("revoke certificates: %w", err)
	}
	serials, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, nil, fmt.Errorf("revoke certificates: %w", err)
	}
	if err := publishRevocation(ctx, tx, id, g, reason, now); err != nil {
		return 0, nil, err
	}
	slices.Sort(serials)
	return uint64(g), serials, nil
}

// lakName is a node's LAK name as its column holds it: NULL for none.
func lakName(name []byte) any {
	if len(name) == 0 {
		return nil
	}
	return name
}
