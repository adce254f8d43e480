package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var (
	qInsertHistory = newWriteQuery(`INSERT INTO node_history (time, node_id, from_state, to_state, actor, reason, request_id)
		VALUES (?, ?, ?, ?, ?, ?, ?)`)
	qNodeHistory = newReadQuery(`SELECT time, node_id, from_state, to_state, actor, reason, request_id
		FROM node_history WHERE node_id = ? ORDER BY seq`)
	qSetState = newWriteQuery(`UPDATE nodes SET state = ? WHERE id = ?`)
	qGetNodeW = newWriteQuery(`SELECT ` + nodeColumns + ` FROM nodes n WHERE n.id = ?`)

	claimColumns = `key, attestor, ek_pin, product_uuid, serials, macs, hostname, peer, reason, declared, first_seen, last_seen, count`
	qClaimExists = newWriteQuery(`SELECT count(*) FROM claims WHERE key = ?`)
	qCountClaims = newWriteQuery(`SELECT count(*) FROM claims`)
	qEvictClaims = newWriteQuery(`DELETE FROM claims WHERE key IN (
		SELECT key FROM claims ORDER BY last_seen NULLS FIRST, key LIMIT ?)`)
	qInsertClaim = newWriteQuery(`INSERT INTO claims (` + claimColumns + `)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11, 1)`)
	qUpdateClaim = newWriteQuery(`UPDATE claims SET attestor = ?2, ek_pin = ?3, product_uuid = ?4, serials = ?5,
		macs = ?6, hostname = ?7, peer = ?8, reason = ?9, declared = ?10, last_seen = ?11, count = count + 1
		WHERE key = ?1`)
	qDeleteClaim = newWriteQuery(`DELETE FROM claims WHERE key = ?`)
	qListClaims  = newReadQuery(`SELECT ` + claimColumns + ` FROM claims ORDER BY last_seen DESC NULLS LAST, key LIMIT ?`)
)

// historyArgs returns the column values of h.
func historyArgs(a *args, h store.StateChange) []any {
	return []any{a.time(h.Time), h.NodeID, h.From, h.To, h.Actor, h.Reason, h.RequestID}
}

func insertHistory(t *wtx, vals []any) error {
	if _, err := t.exec(qInsertHistory, vals...); err != nil {
		return fmt.Errorf("append state history: %w", err)
	}
	return nil
}

// TransitionNode changes a node's state (see store.Store.TransitionNode).
func (d *DB) TransitionNode(ctx context.Context, tr store.Transition) (store.Node, []string, error) {
	if tr.NodeID == "" || tr.To == "" {
		return store.Node{}, nil, errors.New("transition node: no node id or no state")
	}
	if tr.Create != nil && tr.Create.ID != tr.NodeID {
		return store.Node{}, nil, fmt.Errorf("transition node %q: the node to create is %q", tr.NodeID, tr.Create.ID)
	}
	var a args
	at := a.time(tr.Time)
	auditVals := auditArgs(&a, tr.Audit)
	var createVals []any
	if tr.Create != nil {
		n := *tr.Create
		n.State = tr.To
		createVals = nodeArgs(&a, n)
	}
	if err := revokeArgs(a, at); err != nil {
		return store.Node{}, nil, fmt.Errorf("transition node %q: %w", tr.NodeID, err)
	}
	var (
		out     store.Node
		serials []string
	)
	err := d.write(ctx, func(t *wtx) error {
		var (
			from string
			gen  int64
		)
		err := t.queryRow(qNodeStateW, tr.NodeID).Scan(&from, &gen)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if tr.Create == nil {
				return store.ErrNotFound
			}
			from = store.StatePlanned
			if !slices.Contains(tr.From, from) {
				return fmt.Errorf("no node, and %s is not a state it may change from: %w", from, store.ErrConflict)
			}
			if err := checkTombstone(t, tr.NodeID, tr.Create.Generation); err != nil {
				return err
			}
			if err := putNode(t, createVals, false); err != nil {
				return err
			}
		case err != nil:
			return fmt.Errorf("read node state: %w", err)
		default:
			if !slices.Contains(tr.From, from) {
				return fmt.Errorf("node is %s: %w", from, store.ErrConflict)
			}
			if tr.Revoke {
				if _, serials, err = revoke(t, tr.NodeID, tr.Reason, at, nil, true); err != nil {
					return err
				}
			}
			if _, err := t.exec(qSetState, tr.To, tr.NodeID); err != nil {
				return fmt.Errorf("set state: %w", err)
			}
		}
		h := store.StateChange{Time: tr.Time, NodeID: tr.NodeID, From: from, To: tr.To, Actor: tr.Actor, Reason: tr.Reason, RequestID: tr.RequestID}
		var ha args
		if err := insertHistory(t, historyArgs(&ha, h)); err != nil {
			return err
		}
		if err := insertAudit(t, auditVals); err != nil {
			return err
		}
		out, err = scanNode(t.queryRow(qGetNodeW, tr.NodeID))
		return err
	})
	if err != nil {
		return store.Node{}, nil, fmt.Errorf("transition node %q to %s: %w", tr.NodeID, tr.To, err)
	}
	return out, serials, nil
}

// NodeHistory returns the state changes of a node id, oldest first.
func (d *DB) NodeHistory(ctx context.Context, id string) ([]store.StateChange, error) {
	rows, err := d.query(ctx, qNodeHistory, id)
	if err != nil {
		return nil, fmt.Errorf("node history of %q: %w", id, err)
	}
	defer rows.Close()
	var hs []store.StateChange
	for rows.Next() {
		var (
			h  store.StateChange
			at sql.NullInt64
		)
		if err := rows.Scan(&at, &h.NodeID, &h.From, &h.To, &h.Actor, &h.Reason, &h.RequestID); err != nil {
			return nil, fmt.Errorf("node history of %q: %w", id, err)
		}
		h.Time = fromNanos(at)
		hs = append(hs, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("node history of %q: %w", id, err)
	}
	return hs, nil
}

// RecordClaim records a machine that was not admitted (see
// store.Store.RecordClaim).
func (d *DB) RecordClaim(ctx context.Context, c store.Claim, max int) error {
	if c.Key == "" {
		return errors.New("record claim: no key")
	}
	if max < 1 {
		return fmt.Errorf("record claim: max %d is not positive", max)
	}
	var a args
	vals := []any{c.Key, c.Attestor, c.EKPin, c.ProductUUID, a.list(c.Serials), a.list(c.MACs),
		c.Hostname, c.Peer, c.Reason, c.Declared, a.time(c.LastSeen)}
	if a.err != nil {
		return fmt.Errorf("record claim: %w", a.err)
	}
	err := d.write(ctx, func(t *wtx) error {
		var n int
		if err := t.queryRow(qClaimExists, c.Key).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			_, err := t.exec(qUpdateClaim, vals...)
			return err
		}
		if err := t.queryRow(qCountClaims).Scan(&n); err != nil {
			return err
		}
		if n >= max {
			if _, err := t.exec(qEvictClaims, n-max+1); err != nil {
				return err
			}
		}
		_, err := t.exec(qInsertClaim, vals...)
		return err
	})
	if err != nil {
		return fmt.Errorf("record claim: %w", err)
	}
	return nil
}

// ListClaims returns at most limit claims, the most recently seen first.
func (d *DB) ListClaims(ctx context.Context, limit int) ([]store.Claim, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list claims: limit %d is not positive", limit)
	}
	rows, err := d.query(ctx, qListClaims, limit)
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	defer rows.Close()
	var cs []store.Claim
	for rows.Next() {
		var (
			c             store.Claim
			serials, macs string
			first, last   sql.NullInt64
			count         int64
		)
		if err := rows.Scan(&c.Key, &c.Attestor, &c.EKPin, &c.ProductUUID, &serials, &macs, &c.Hostname, &c.Peer,
			&c.Reason, &c.Declared, &first, &last, &count); err != nil {
			return nil, fmt.Errorf("list claims: %w", err)
		}
		if c.Serials, err = fromList(serials); err != nil {
			return nil, fmt.Errorf("list claims: %w", err)
		}
		if c.MACs, err = fromList(macs); err != nil {
			return nil, fmt.Errorf("list claims: %w", err)
		}
		c.FirstSeen, c.LastSeen, c.Count = fromNanos(first), fromNanos(last), uint64(max(count, 0))
		cs = append(cs, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	return cs, nil
}
