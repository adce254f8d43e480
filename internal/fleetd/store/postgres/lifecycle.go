package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// The fleet lifecycle's records (internal/fleetd/lifecycle): admin
// credentials, the declared inventory and its changelog, node transitions
// and their history, and claims. Each method has the contract written on
// store.Store and the SQLite store's behaviour where it leaves a choice.

const adminColumns = `serial, name, role, created_by, created_at, not_after, revoked_at, revoked_by`

func scanAdmin(s pgx.Row) (store.AdminCred, error) {
	var (
		c                         store.AdminCred
		created, notAfter, revkAt *time.Time
	)
	if err := s.Scan(&c.Serial, &c.Name, &c.Role, &c.CreatedBy, &created, &notAfter, &revkAt, &c.RevokedBy); err != nil {
		return store.AdminCred{}, err
	}
	c.CreatedAt, c.NotAfter, c.RevokedAt = fromTS(created), fromTS(notAfter), fromTS(revkAt)
	return c, nil
}

// CreateAdmin records an admin credential; ErrConflict if its serial exists
// or an unrevoked credential has its name.
func (d *DB) CreateAdmin(ctx context.Context, c store.AdminCred, audit *store.AuditEvent) error {
	if c.Serial == "" || c.Name == "" || c.Role == "" {
		return fmt.Errorf("create admin %q: no serial, name or role", c.Name)
	}
	err := d.tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO admins (`+adminColumns+`) VALUES ($1, $2, $3, $4, $5, $6, NULL, '')
			ON CONFLICT DO NOTHING`, c.Serial, c.Name, c.Role, c.CreatedBy, ts(c.CreatedAt), ts(c.NotAfter))
		if err != nil {
			return err
		}
		if err := mustChange(tag, fmt.Errorf("a credential with this serial, or an unrevoked one named %s, exists: %w", c.Name, store.ErrConflict)); err != nil {
			return err
		}
		return insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return fmt.Errorf("create admin %s: %w", c.Name, err)
	}
	return nil
}

// GetAdmin returns the credential with this serial; ErrNotFound if none.
func (d *DB) GetAdmin(ctx context.Context, serial string) (store.AdminCred, error) {
	c, err := scanAdmin(d.pool.QueryRow(ctx, `SELECT `+adminColumns+` FROM admins WHERE serial = $1`, serial))
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.AdminCred{}, fmt.Errorf("get admin %s: %w", serial, wrap(err))
	}
	return c, nil
}

// ListAdmins returns every credential ordered by name, then CreatedAt.
func (d *DB) ListAdmins(ctx context.Context) ([]store.AdminCred, error) {
	rows, err := d.pool.Query(ctx, `SELECT `+adminColumns+` FROM admins ORDER BY name, created_at, serial`)
	if err != nil {
		return nil, fmt.Errorf("list admins: %w", wrap(err))
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.AdminCred, error) { return scanAdmin(r) })
	if err != nil {
		return nil, fmt.Errorf("list admins: %w", wrap(err))
	}
	return cs, nil
}

// RevokeAdmin revokes the unrevoked credentials named name.
func (d *DB) RevokeAdmin(ctx context.Context, name, by string, now time.Time, audit *store.AuditEvent) ([]store.AdminCred, error) {
	if now.IsZero() {
		return nil, fmt.Errorf("revoke admin %s: no time given", name)
	}
	var out []store.AdminCred
	err := d.tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE admins SET revoked_at = $1, revoked_by = $2
			WHERE name = $3 AND revoked_at IS NULL RETURNING `+adminColumns, ts(now), by, name)
		if err != nil {
			return err
		}
		if out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.AdminCred, error) { return scanAdmin(r) }); err != nil {
			return err
		}
		if len(out) == 0 {
			return store.ErrNotFound
		}
		return insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return nil, fmt.Errorf("revoke admin %s: %w", name, err)
	}
	return out, nil
}

const declColumns = `name, serial, product_uuid, macs, class, site, role, switch_chassis,
	switch_port, ek_pins, ek_source, ek_reference, version, updated_at, install_disk`

func scanDecl(s pgx.Row) (store.Declaration, error) {
	var (
		dc      store.Declaration
		version int64
		updated *time.Time
	)
	if err := s.Scan(&dc.Name, &dc.Serial, &dc.ProductUUID, &dc.MACs, &dc.Class, &dc.Site, &dc.Role,
		&dc.SwitchChassis, &dc.SwitchPort, &dc.EKPins, &dc.EKSource, &dc.EKReference, &version, &updated, &dc.InstallDisk); err != nil {
		return store.Declaration{}, err
	}
	dc.MACs, dc.EKPins = fromList(dc.MACs), fromList(dc.EKPins)
	dc.Version, dc.UpdatedAt = uint64(max(version, 0)), fromTS(updated)
	return dc, nil
}

// ApplyInventory writes declarations and their changelog in one
// transaction.
func (d *DB) ApplyInventory(ctx context.Context, w store.InventoryWrite) error {
	for _, dw := range w.Writes {
		if dw.Declaration.Name == "" {
			return errors.New("apply inventory: a declaration has no name")
		}
		if dw.PrevVersion >= 1<<62 {
			return fmt.Errorf("apply inventory: declaration %s: version %d is too large", dw.Declaration.Name, dw.PrevVersion)
		}
	}
	err := d.tx(ctx, func(tx pgx.Tx) error {
		for _, dw := range w.Writes {
			dc := dw.Declaration
			vals := []any{dc.Name, dc.Serial, dc.ProductUUID, list(dc.MACs), dc.Class, dc.Site, dc.Role,
				dc.SwitchChassis, dc.SwitchPort, list(dc.EKPins), dc.EKSource, dc.EKReference, int64(dw.PrevVersion + 1), ts(dc.UpdatedAt),
				dc.InstallDisk}
			q := `INSERT INTO declarations (` + declColumns + `)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) ON CONFLICT DO NOTHING`
			if dw.PrevVersion > 0 {
				q = `UPDATE declarations SET serial = $2, product_uuid = $3, macs = $4, class = $5, site = $6, role = $7,
					switch_chassis = $8, switch_port = $9, ek_pins = $10, ek_source = $11, ek_reference = $12,
					version = $13, updated_at = $14, install_disk = $15 WHERE name = $1 AND version = $16`
				vals = append(vals, int64(dw.PrevVersion))
			}
			tag, err := tx.Exec(ctx, q, vals...)
			if err != nil {
				return fmt.Errorf("write declaration %s: %w", dc.Name, err)
			}
			if err := mustChange(tag, fmt.Errorf("declaration %s changed since version %d: %w", dc.Name, dw.PrevVersion, store.ErrConflict)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE nodes SET class = $2 WHERE id = $1`, dc.Name, dc.Class); err != nil {
				return fmt.Errorf("write declaration %s: %w", dc.Name, err)
			}
			if _, err := tx.Exec(ctx, `UPDATE nodes SET role = $2, site = $3 WHERE id = $1 AND state IN ('planned', 'provisioning')`,
				dc.Name, dc.Role, dc.Site); err != nil {
				return fmt.Errorf("write declaration %s: %w", dc.Name, err)
			}
		}
		if len(w.Changes) > 0 {
			rows := make([][]any, len(w.Changes))
			for i, c := range w.Changes {
				rows[i] = []any{ts(c.Time), c.Device, c.Field, c.Old, c.New, c.Actor, c.ActorRole, c.RequestID, c.Source}
			}
			// Rows are inserted in order, so seq follows the changes' order.
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"inventory_changes"},
				[]string{"time", "device", "field", "old", "new", "actor", "actor_role", "request_id", "source"},
				pgx.CopyFromRows(rows)); err != nil {
				return fmt.Errorf("append changelog: %w", err)
			}
		}
		return insertAudit(ctx, tx, w.Audit)
	})
	if err != nil {
		return fmt.Errorf("apply inventory: %w", err)
	}
	return nil
}

func (d *DB) queryDecls(ctx context.Context, q string, args ...any) ([]store.Declaration, error) {
	rows, err := d.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, wrap(err)
	}
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Declaration, error) { return scanDecl(r) })
	return ds, wrap(err)
}

// GetDeclaration returns one declaration; ErrNotFound if none.
func (d *DB) GetDeclaration(ctx context.Context, name string) (store.Declaration, error) {
	dc, err := scanDecl(d.pool.QueryRow(ctx, `SELECT `+declColumns+` FROM declarations WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Declaration{}, fmt.Errorf("get declaration %q: %w", name, wrap(err))
	}
	return dc, nil
}

// ListDeclarations returns every declaration ordered by name.
func (d *DB) ListDeclarations(ctx context.Context) ([]store.Declaration, error) {
	ds, err := d.queryDecls(ctx, `SELECT `+declColumns+` FROM declarations ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list declarations: %w", err)
	}
	return ds, nil
}

// DeclarationsByClaims returns the declarations whose product UUID or
// serial matches.
func (d *DB) DeclarationsByClaims(ctx context.Context, productUUID string, serials []string) ([]store.Declaration, error) {
	serials = slices.DeleteFunc(slices.Clone(serials), func(s string) bool { return s == "" })
	if productUUID == "" && len(serials) == 0 {
		return nil, nil
	}
	ds, err := d.queryDecls(ctx, `SELECT `+declColumns+` FROM declarations
		WHERE ($1 <> '' AND product_uuid = $1) OR (serial <> '' AND serial = ANY($2)) ORDER BY name`, productUUID, list(serials))
	if err != nil {
		return nil, fmt.Errorf("declarations by claims: %w", err)
	}
	return ds, nil
}

// DeclarationsByEKPin returns the declarations whose binding names pin.
func (d *DB) DeclarationsByEKPin(ctx context.Context, pin string) ([]store.Declaration, error) {
	if pin == "" {
		return nil, nil
	}
	ds, err := d.queryDecls(ctx, `SELECT `+declColumns+` FROM declarations WHERE ek_pins @> ARRAY[$1] ORDER BY name`, pin)
	if err != nil {
		return nil, fmt.Errorf("declarations by EK pin: %w", err)
	}
	return ds, nil
}

// ListChanges returns a device's changelog (all devices for ""), newest
// first.
func (d *DB) ListChanges(ctx context.Context, device string, limit int) ([]store.FieldChange, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list changes: limit %d is not positive", limit)
	}
	rows, err := d.pool.Query(ctx, `SELECT time, device, field, old, new, actor, actor_role, request_id, source
		FROM inventory_changes WHERE $1 = '' OR device = $1 ORDER BY time DESC NULLS LAST, seq DESC LIMIT $2`, device, limit)
	if err != nil {
		return nil, fmt.Errorf("list changes: %w", wrap(err))
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.FieldChange, error) {
		var (
			c  store.FieldChange
			at *time.Time
		)
		err := r.Scan(&at, &c.Device, &c.Field, &c.Old, &c.New, &c.Actor, &c.ActorRole, &c.RequestID, &c.Source)
		c.Time = fromTS(at)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("list changes: %w", wrap(err))
	}
	return cs, nil
}

func insertHistory(ctx context.Context, tx pgx.Tx, h store.StateChange) error {
	if _, err := tx.Exec(ctx, `INSERT INTO node_history (time, node_id, from_state, to_state, actor, reason, request_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, ts(h.Time), h.NodeID, h.From, h.To, h.Actor, h.Reason, h.RequestID); err != nil {
		return fmt.Errorf("append state history: %w", err)
	}
	return nil
}

// TransitionNode changes a node's state (see store.Store.TransitionNode).
// A retirement's revocation reaches the other replicas as RevokeNode's
// does.
func (d *DB) TransitionNode(ctx context.Context, t store.Transition) (store.Node, []string, error) {
	if t.NodeID == "" || t.To == "" {
		return store.Node{}, nil, errors.New("transition node: no node id or no state")
	}
	if t.Create != nil && t.Create.ID != t.NodeID {
		return store.Node{}, nil, fmt.Errorf("transition node %q: the node to create is %q", t.NodeID, t.Create.ID)
	}
	if t.Time.IsZero() {
		return store.Node{}, nil, fmt.Errorf("transition node %q: no time given", t.NodeID)
	}
	var (
		out     store.Node
		serials []string
	)
	err := d.tx(ctx, func(tx pgx.Tx) error {
		if err := lockNode(ctx, tx, t.NodeID); err != nil {
			return err
		}
		var from string
		err := tx.QueryRow(ctx, `SELECT state FROM nodes WHERE id = $1`, t.NodeID).Scan(&from)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			if t.Create == nil {
				return store.ErrNotFound
			}
			from = store.StatePlanned
			if !slices.Contains(t.From, from) {
				return fmt.Errorf("no node, and %s is not a state it may change from: %w", from, store.ErrConflict)
			}
			n := *t.Create
			n.State = t.To
			g, err := gen(n.Generation)
			if err != nil {
				return err
			}
			if err := checkTombstone(ctx, tx, n.ID, g); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, nodeInsert, nodeArgs(n, g)...); err != nil {
				return fmt.Errorf("write node: %w", err)
			}
		case err != nil:
			return fmt.Errorf("read node state: %w", err)
		default:
			if !slices.Contains(t.From, from) {
				return fmt.Errorf("node is %s: %w", from, store.ErrConflict)
			}
			if t.Revoke {
				if _, serials, err = revoke(ctx, tx, t.NodeID, t.Reason, t.Time, nil, true); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `UPDATE nodes SET state = $1 WHERE id = $2`, t.To, t.NodeID); err != nil {
				return fmt.Errorf("set state: %w", err)
			}
		}
		h := store.StateChange{Time: t.Time, NodeID: t.NodeID, From: from, To: t.To, Actor: t.Actor, Reason: t.Reason, RequestID: t.RequestID}
		if err := insertHistory(ctx, tx, h); err != nil {
			return err
		}
		if err := insertAudit(ctx, tx, t.Audit); err != nil {
			return err
		}
		out, err = scanNode(tx.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE id = $1`, t.NodeID))
		return err
	})
	if err != nil {
		return store.Node{}, nil, fmt.Errorf("transition node %q to %s: %w", t.NodeID, t.To, err)
	}
	return out, serials, nil
}

// NodeHistory returns the state changes of a node id, oldest first.
func (d *DB) NodeHistory(ctx context.Context, id string) ([]store.StateChange, error) {
	rows, err := d.pool.Query(ctx, `SELECT time, node_id, from_state, to_state, actor, reason, request_id
		FROM node_history WHERE node_id = $1 ORDER BY seq`, id)
	if err != nil {
		return nil, fmt.Errorf("node history of %q: %w", id, wrap(err))
	}
	hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.StateChange, error) {
		var (
			h  store.StateChange
			at *time.Time
		)
		err := r.Scan(&at, &h.NodeID, &h.From, &h.To, &h.Actor, &h.Reason, &h.RequestID)
		h.Time = fromTS(at)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("node history of %q: %w", id, wrap(err))
	}
	return hs, nil
}

// claimsLock is the advisory lock key of the claims table's bound (the
// bytes of "ntclaims").
const claimsLock = 0x6e74636c61696d73

const claimColumns = `key, attestor, ek_pin, product_uuid, serials, macs, hostname, peer, reason, declared, first_seen, last_seen, count`

// RecordClaim records a machine that was not admitted.
func (d *DB) RecordClaim(ctx context.Context, c store.Claim, maxClaims int) error {
	if c.Key == "" {
		return errors.New("record claim: no key")
	}
	if maxClaims < 1 {
		return fmt.Errorf("record claim: max %d is not positive", maxClaims)
	}
	err := d.tx(ctx, func(tx pgx.Tx) error {
		// One writer at a time keeps the bound exact across replicas.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(claimsLock)); err != nil {
			return err
		}
		vals := []any{c.Key, c.Attestor, c.EKPin, c.ProductUUID, list(c.Serials), list(c.MACs), c.Hostname, c.Peer, c.Reason, c.Declared, ts(c.LastSeen)}
		tag, err := tx.Exec(ctx, `UPDATE claims SET attestor = $2, ek_pin = $3, product_uuid = $4, serials = $5, macs = $6,
			hostname = $7, peer = $8, reason = $9, declared = $10, last_seen = $11, count = count + 1 WHERE key = $1`, vals...)
		if err != nil || tag.RowsAffected() > 0 {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM claims`).Scan(&n); err != nil {
			return err
		}
		if n >= maxClaims {
			if _, err := tx.Exec(ctx, `DELETE FROM claims WHERE key IN (
				SELECT key FROM claims ORDER BY last_seen NULLS FIRST, key LIMIT $1)`, n-maxClaims+1); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO claims (`+claimColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, 1)`, vals...)
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
	rows, err := d.pool.Query(ctx, `SELECT `+claimColumns+` FROM claims ORDER BY last_seen DESC NULLS LAST, key LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", wrap(err))
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Claim, error) {
		var (
			c           store.Claim
			first, last *time.Time
			count       int64
		)
		err := r.Scan(&c.Key, &c.Attestor, &c.EKPin, &c.ProductUUID, &c.Serials, &c.MACs, &c.Hostname, &c.Peer,
			&c.Reason, &c.Declared, &first, &last, &count)
		c.Serials, c.MACs = fromList(c.Serials), fromList(c.MACs)
		c.FirstSeen, c.LastSeen, c.Count = fromTS(first), fromTS(last), uint64(max(count, 0))
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", wrap(err))
	}
	return cs, nil
}
