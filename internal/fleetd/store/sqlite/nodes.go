package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// nodeColumns reads a node row n; the claimed serials come from
// node_serials as a JSON array in claim order.
const nodeColumns = `n.id, n.spiffe_id, n.role, n.site, n.state, n.generation, n.attestor,
	n.product_uuid,
	(SELECT json_group_array(s.serial ORDER BY s.pos) FROM node_serials s WHERE s.node_id = n.id),
	n.macs, n.gpu_uuids, n.hostname, n.boot_id, n.daemon_version,
	n.joined_at, n.last_seen, n.cert_serial, n.cert_not_after, n.ek_pin, n.class, n.lak_name`

const nodeInsert = `INSERT INTO nodes (id, spiffe_id, role, site, state, generation, attestor,
		product_uuid, macs, gpu_uuids, hostname, boot_id, daemon_version,
		joined_at, last_seen, cert_serial, cert_not_after, ek_pin, class, lak_name)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

var (
	qInsertNode  = newWriteQuery(nodeInsert + ` ON CONFLICT (id) DO NOTHING`)
	qReplaceNode = newWriteQuery(nodeInsert + ` ON CONFLICT (id) DO UPDATE SET spiffe_id = excluded.spiffe_id,
		role = excluded.role, site = excluded.site, state = excluded.state,
		generation = excluded.generation, attestor = excluded.attestor,
		product_uuid = excluded.product_uuid, macs = excluded.macs, gpu_uuids = excluded.gpu_uuids,
		hostname = excluded.hostname, boot_id = excluded.boot_id,
		daemon_version = excluded.daemon_version, joined_at = excluded.joined_at,
		last_seen = excluded.last_seen, cert_serial = excluded.cert_serial,
		cert_not_after = excluded.cert_not_after, ek_pin = excluded.ek_pin, class = excluded.class,
		lak_name = excluded.lak_name`)
	qRevokeReclaimed = newWriteQuery(`UPDATE certs SET revoked_at = ?, revoked_reason = 'reclaimed'
		WHERE node_id = ? AND revoked_at IS NULL`)
	qDeleteSerials = newWriteQuery(`DELETE FROM node_serials WHERE node_id = ?`)
	qInsertSerial  = newWriteQuery(`INSERT INTO node_serials (node_id, pos, serial) VALUES (?, ?, ?)`)
	qNodeStateW    = newWriteQuery(`SELECT state, generation FROM nodes WHERE id = ?`)
	qRaiseGen      = newWriteQuery(`UPDATE nodes SET generation = generation + 1, state = ?
		WHERE id = ? RETURNING generation`)
	qRevokeCerts = newWriteQuery(`UPDATE certs SET revoked_at = ?, revoked_reason = ?
		WHERE node_id = ? AND revoked_at IS NULL RETURNING serial`)
	qDeleteNode = newWriteQuery(`DELETE FROM nodes WHERE id = ?`)
	// qDeleteEvidence removes a deleted node's kept boot evidence, so a
	// later node of the same id is not captured from it.
	qDeleteEvidence = newWriteQuery(`DELETE FROM boot_evidence WHERE node_id = ?`)
	qPutTombstone   = newWriteQuery(`INSERT INTO node_tombstones (id, generation, deleted_at) VALUES (?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET generation = max(generation, excluded.generation),
		deleted_at = excluded.deleted_at`)
	qTombstoneGen = newWriteQuery(`SELECT generation FROM node_tombstones WHERE id = ?`)
	// qLastGeneration is the highest generation id had: its live row's or
	// its tombstone's; 0 for an id never seen.
	qLastGeneration = newReadQuery(`SELECT max(
		coalesce((SELECT generation FROM nodes WHERE id = ?1), 0),
		coalesce((SELECT generation FROM node_tombstones WHERE id = ?1), 0))`)
	qGetNode     = newReadQuery(`SELECT ` + nodeColumns + ` FROM nodes n WHERE n.id = ?`)
	qListNodes   = newReadQuery(`SELECT ` + nodeColumns + ` FROM nodes n ORDER BY n.id`)
	qNodeByEKPin = newReadQuery(`SELECT ` + nodeColumns + ` FROM nodes n WHERE n.ek_pin = ? AND n.ek_pin <> ''
		ORDER BY n.state = 'retired', n.id LIMIT 1`)
	qNodesByClaims = newReadQuery(`SELECT ` + nodeColumns + ` FROM nodes n
		WHERE n.id IN (
			SELECT id FROM nodes WHERE ?1 <> '' AND product_uuid = ?1
			UNION
			SELECT node_id FROM node_serials WHERE serial IN (SELECT value FROM json_each(?2)))
		ORDER BY n.id`)
)

// CompleteJoin removes the pending join j.PendingID (if any), spends the
// token (if any), writes the node, records the certificate and appends
// j.Audit (if any) in one transaction. It fails with ErrConflict, writing
// nothing, when there is no pending join j.PendingID, when it is not
// approved, or when it was made for another node id or another token hash
// than the join's; when the token is unknown, used or expired at j.Now;
// when j.Reclaim is false and the node id exists; or when the
// certificate's serial exists; and when a deletion left a tombstone for
// the node id and j.Node.Generation is not above the tombstone's
// generation, so that no join brings back a generation whose certificates
// a deletion killed (NextGeneration gives the generation to start at).
// Whether an approved pending join has expired is the caller's to check. A reclaim replaces the stored node if
// there is one (and writes it if there is none), revoking the old node's
// unrevoked certificates with reason "reclaimed" at j.Now. The certificate
// must name the node and its generation.
//
// Concurrent CompleteJoin and RecordRenewal calls share transactions (see
// batch.go): each returns once the transaction that holds its join has
// committed, or with the error that kept its join out.
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
	call := &joinCall{
		j:         j,
		now:       a.time(j.Now),
		nodeVals:  nodeArgs(&a, n),
		certVals:  certArgs(&a, c),
		auditVals: auditArgs(&a, j.Audit),
	}
	for _, h := range j.History {
		call.historyVals = append(call.historyVals, historyArgs(&a, h))
	}
	if a.err != nil {
		return fmt.Errorf("complete join for node %q: %w", n.ID, a.err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("complete join for node %q: %w", n.ID, err)
	}
	if err := d.batched(ctx, call); err != nil {
		return fmt.Errorf("complete join for node %q: %w", n.ID, err)
	}
	return nil
}

// joinCall is the op of one CompleteJoin call: its join with the column
// values already converted.
type joinCall struct {
	j                             store.Join
	now                           sql.NullInt64
	nodeVals, certVals, auditVals []any
	historyVals                   [][]any
}

func (call *joinCall) String() string { return fmt.Sprintf("join of node %q", call.j.Node.ID) }

// write writes the join of call in t: everything CompleteJoin writes.
func (call *joinCall) write(t *wtx) error {
	j := &call.j
	if err := checkTombstone(t, j.Node.ID, j.Node.Generation); err != nil {
		return err
	}
	if j.PendingID != "" {
		if err := takePending(t, j.PendingID, j.Node.ID, j.TokenHash); err != nil {
			return err
		}
	}
	if j.TokenHash != nil {
		if err := spendToken(t, j.TokenHash, j.Node.ID, call.now); err != nil {
			return err
		}
	}
	if j.ExpectState != "" {
		if err := expectNode(t, j.Node.ID, j.ExpectState, j.ExpectGeneration); err != nil {
			return err
		}
	}
	if j.Reclaim {
		if _, err := t.exec(qRevokeReclaimed, call.now, j.Node.ID); err != nil {
			return fmt.Errorf("revoke certificates of the reclaimed node: %w", err)
		}
	}
	if err := putNode(t, call.nodeVals, j.Reclaim); err != nil {
		return err
	}
	if err := putSerials(t, j.Node.ID, j.Node.Claims.Serials); err != nil {
		return err
	}
	if err := insertCert(t, j.Cert.Serial, call.certVals); err != nil {
		return err
	}
	for _, h := range call.historyVals {
		if err := insertHistory(t, h); err != nil {
			return err
		}
	}
	if j.ClaimKey != "" {
		if _, err := t.exec(qDeleteClaim, j.ClaimKey); err != nil {
			return fmt.Errorf("remove claim: %w", err)
		}
	}
	return insertAudit(t, call.auditVals)
}

// expectNode refuses, with ErrConflict, unless node id exists with state
// and generation gen.
func expectNode(t *wtx, id, state string, gen uint64) error {
	var (
		cur string
		g   int64
	)
	err := t.queryRow(qNodeStateW, id).Scan(&cur, &g)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("node %q is gone: %w", id, store.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("read node state: %w", err)
	}
	if cur != state || g < 0 || uint64(g) != gen {
		return fmt.Errorf("node %q is %s at generation %d, the join expected %s at %d: %w", id, cur, g, state, gen, store.ErrConflict)
	}
	return nil
}

func nodeArgs(a *args, n store.Node) []any {
	return []any{n.ID, n.SPIFFEID, n.Role, n.Site, n.State, a.gen(n.Generation), n.Attestor,
		n.Claims.ProductUUID, a.list(n.Claims.MACs), a.list(n.Claims.GPUUUIDs),
		n.Claims.Hostname, n.Claims.BootID, n.DaemonVersion,
		a.time(n.JoinedAt), a.time(n.LastSeen), n.CertSerial, a.time(n.CertNotAfter), n.EKPin, n.Class, lakName(n.LAKName)}
}

// checkTombstone refuses, with ErrConflict, a node id a deletion left a
// tombstone for at generation gen or above. A later join may leave the
// tombstone in place: the generations of the id only rise.
func checkTombstone(t *wtx, id string, gen uint64) error {
	var dead int64
	err := t.queryRow(qTombstoneGen, id).Scan(&dead)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read tombstone: %w", err)
	}
	if dead >= 0 && gen <= uint64(dead) {
		return fmt.Errorf("node %q was deleted at generation %d, the join is at generation %d: %w",
			id, dead, gen, store.ErrConflict)
	}
	return nil
}

// NextGeneration returns the generation a new node with this id must start
// at: one more than the generation of its live row or of the tombstone its
// deletion left, whichever is higher; 1 for an id never seen.
func (d *DB) NextGeneration(ctx context.Context, id string) (uint64, error) {
	var last int64
	if err := d.queryRow(ctx, qLastGeneration, id).Scan(&last); err != nil {
		return 0, fmt.Errorf("next generation of node %q: %w", id, err)
	}
	if last < 0 || last == math.MaxInt64 {
		return 0, fmt.Errorf("next generation of node %q: generation %d leaves no next one", id, last)
	}
	return uint64(last) + 1, nil
}

// putNode inserts the node row, or with replace overwrites the one with the
// same id. Without replace an existing id is an ErrConflict.
func putNode(t *wtx, vals []any, replace bool) error {
	q := qInsertNode
	if replace {
		q = qReplaceNode
	}
	res, err := t.exec(q, vals...)
	if err != nil {
		return fmt.Errorf("write node: %w", err)
	}
	return mustChange(res, fmt.Errorf("node exists: %w", store.ErrConflict))
}

// putSerials replaces the node's claimed serials.
func putSerials(t *wtx, id string, serials []string) error {
	if _, err := t.exec(qDeleteSerials, id); err != nil {
		return fmt.Errorf("write serials: %w", err)
	}
	for i, s := range serials {
		if _, err := t.exec(qInsertSerial, id, i, s); err != nil {
			return fmt.Errorf("write serials: %w", err)
		}
	}
	return nil
}

// GetNode returns one node; ErrNotFound if there is none.
func (d *DB) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := scanNode(d.queryRow(ctx, qGetNode, id))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Node{}, fmt.Errorf("get node %q: %w", id, err)
	}
	return n, nil
}

// NodeByEKPin returns the node whose tpm join proved the EK with this pin,
// one that is not retired when there is one (a retired machine declared
// again under a new name proves the same EK); ErrNotFound if none did.
func (d *DB) NodeByEKPin(ctx context.Context, pin string) (store.Node, error) {
	if pin == "" {
		return store.Node{}, fmt.Errorf("node by EK pin: empty pin: %w", store.ErrNotFound)
	}
	n, err := scanNode(d.queryRow(ctx, qNodeByEKPin, pin))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Node{}, fmt.Errorf("node with EK %s: %w", pin, store.ErrNotFound)
	}
	if err != nil {
		return store.Node{}, fmt.Errorf("node by EK pin: %w", err)
	}
	return n, nil
}

// ListNodes returns all nodes ordered by id.
func (d *DB) ListNodes(ctx context.Context) ([]store.Node, error) {
	ns, err := d.queryNodes(ctx, qListNodes)
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
	ns, err := d.queryNodes(ctx, qNodesByClaims, productUUID, list)
	if err != nil {
		return nil, fmt.Errorf("find nodes by claims: %w", err)
	}
	return ns, nil
}

func (d *DB) queryNodes(ctx context.Context, q readQuery, vals ...any) ([]store.Node, error) {
	return queryAll(ctx, d, scanNode, q, vals...)
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
		&n.DaemonVersion, &joined, &lastSeen, &n.CertSerial, &certNotAfter, &n.EKPin, &n.Class, &n.LAKName); err != nil {
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
// ErrNotFound if there is no such node. The audit event, when not nil, is
// appended in the same transaction, so it is written if and only if the
// revocation is.
func (d *DB) RevokeNode(ctx context.Context, id, reason string, now time.Time, audit *store.AuditEvent) (uint64, []string, error) {
	var a args
	at := a.time(now)
	auditVals := auditArgs(&a, audit)
	if err := revokeArgs(a, at); err != nil {
		return 0, nil, fmt.Errorf("revoke node %q: %w", id, err)
	}
	var (
		gen     uint64
		serials []string
	)
	err := d.write(ctx, func(t *wtx) (err error) {
		if gen, serials, err = revoke(t, id, reason, at, audit, false); err != nil {
			return err
		}
		return insertAudit(t, auditVals)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("revoke node %q: %w", id, err)
	}
	return gen, serials, nil
}

// DeleteNode revokes as RevokeNode does, then removes the node record and
// its claims; its certificate records stay, revoked. It leaves (or raises)
// the id's tombstone at the generation it revoked at. It returns the
// revoked serials; ErrNotFound if there is no such node. The audit event,
// when not nil, is appended in the same transaction.
func (d *DB) DeleteNode(ctx context.Context, id, reason string, now time.Time, audit *store.AuditEvent) (uint64, []string, error) {
	var a args
	at := a.time(now)
	auditVals := auditArgs(&a, audit)
	if err := revokeArgs(a, at); err != nil {
		return 0, nil, fmt.Errorf("delete node %q: %w", id, err)
	}
	var (
		gen     uint64
		serials []string
	)
	err := d.write(ctx, func(t *wtx) (err error) {
		if gen, serials, err = revoke(t, id, reason, at, audit, false); err != nil {
			return err
		}
		if _, err := t.exec(qPutTombstone, id, int64(gen), at); err != nil {
			return fmt.Errorf("write tombstone: %w", err)
		}
		if _, err := t.exec(qDeleteNode, id); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		if _, err := t.exec(qDeleteEvidence, id); err != nil {
			return fmt.Errorf("delete its boot evidence: %w", err)
		}
		return insertAudit(t, auditVals)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("delete node %q: %w", id, err)
	}
	return gen, serials, nil
}

// revokeArgs checks the converted arguments of a revocation: a time must be
// given.
func revokeArgs(a args, at sql.NullInt64) error {
	if a.err != nil {
		return a.err
	}
	if !at.Valid {
		return errors.New("no time given")
	}
	return nil
}

// revoke raises the node's generation and revokes its certificates. The
// state becomes revoked unless the node is quarantined, retired or
// planned, which it stays; a change of state goes into the history with
// audit's actor (or "fleetd"). With keepState the state does not change.
func revoke(t *wtx, id, reason string, at sql.NullInt64, audit *store.AuditEvent, keepState bool) (uint64, []string, error) {
	var (
		old  string
		prev int64
	)
	err := t.queryRow(qNodeStateW, id).Scan(&old, &prev)
	if errors.Is(err, sql.ErrNoRows) {
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
	var gen int64
	if err := t.queryRow(qRaiseGen, state, id).Scan(&gen); err != nil {
		return 0, nil, fmt.Errorf("raise generation: %w", err)
	}
	if state != old {
		h := store.StateChange{NodeID: id, From: old, To: state, Actor: "fleetd", Reason: reason}
		if audit != nil {
			h.Time, h.Actor = audit.Time, audit.Actor
		}
		var a args
		vals := historyArgs(&a, h)
		if a.err == nil && !h.Time.IsZero() {
			vals[0] = at
		}
		if err := insertHistory(t, vals); err != nil {
			return 0, nil, err
		}
	}
	rows, err := t.query(qRevokeCerts, at, reason, id)
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

// lakName is a node's LAK name as its column holds it: NULL for none.
func lakName(name []byte) any {
	if len(name) == 0 {
		return nil
	}
	return name
}
