package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const declColumns = `d.name, d.serial, d.product_uuid, d.macs, d.class, d.site, d.role, d.switch_chassis,
	d.switch_port, d.ek_pins, d.ek_source, d.ek_reference, d.version, d.updated_at, d.install_disk`

var (
	qInsertDecl = newWriteQuery(`INSERT INTO declarations (name, serial, product_uuid, macs, class, site, role,
		switch_chassis, switch_port, ek_pins, ek_source, ek_reference, version, updated_at, install_disk)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15) ON CONFLICT DO NOTHING`)
	qUpdateDecl = newWriteQuery(`UPDATE declarations SET serial = ?2, product_uuid = ?3, macs = ?4, class = ?5,
		site = ?6, role = ?7, switch_chassis = ?8, switch_port = ?9, ek_pins = ?10, ek_source = ?11,
		ek_reference = ?12, version = ?13, updated_at = ?14, install_disk = ?15
		WHERE name = ?1 AND version = ?16`)
	qDeletePins    = newWriteQuery(`DELETE FROM declaration_ek_pins WHERE name = ?`)
	qInsertPin     = newWriteQuery(`INSERT OR IGNORE INTO declaration_ek_pins (name, pin) VALUES (?, ?)`)
	qDeclToNode    = newWriteQuery(`UPDATE nodes SET class = ?2 WHERE id = ?1`)
	qDeclToPlanned = newWriteQuery(`UPDATE nodes SET role = ?2, site = ?3 WHERE id = ?1 AND state IN ('planned', 'provisioning')`)
	qInsertChange  = newWriteQuery(`INSERT INTO inventory_changes (time, device, field, old, new, actor, actor_role, request_id, source)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`)

	qGetDecl      = newReadQuery(`SELECT ` + declColumns + ` FROM declarations d WHERE d.name = ?`)
	qListDecls    = newReadQuery(`SELECT ` + declColumns + ` FROM declarations d ORDER BY d.name`)
	qDeclsByClaim = newReadQuery(`SELECT ` + declColumns + ` FROM declarations d
		WHERE (?1 <> '' AND d.product_uuid = ?1)
		   OR (d.serial <> '' AND d.serial IN (SELECT value FROM json_each(?2)))
		ORDER BY d.name`)
	qDeclsByPin = newReadQuery(`SELECT ` + declColumns + ` FROM declarations d
		WHERE d.name IN (SELECT name FROM declaration_ek_pins WHERE pin = ?) ORDER BY d.name`)
	qChanges = newReadQuery(`SELECT time, device, field, old, new, actor, actor_role, request_id, source
		FROM inventory_changes WHERE ?1 = '' OR device = ?1 ORDER BY time DESC NULLS LAST, seq DESC LIMIT ?2`)
)

// ApplyInventory writes declarations and their changelog in one
// transaction (see store.Store.ApplyInventory).
func (d *DB) ApplyInventory(ctx context.Context, w store.InventoryWrite) error {
	var a args
	type write struct {
		name string
		prev uint64
		vals []any
		pins []string
		decl store.Declaration
	}
	writes := make([]write, 0, len(w.Writes))
	for _, dw := range w.Writes {
		dc := dw.Declaration
		if dc.Name == "" {
			return errors.New("apply inventory: a declaration has no name")
		}
		if dw.PrevVersion >= 1<<62 {
			return fmt.Errorf("apply inventory: declaration %s: version %d is too large", dc.Name, dw.PrevVersion)
		}
		vals := []any{dc.Name, dc.Serial, dc.ProductUUID, a.list(dc.MACs), dc.Class, dc.Site, dc.Role,
			dc.SwitchChassis, dc.SwitchPort, a.list(dc.EKPins), dc.EKSource, dc.EKReference,
			int64(dw.PrevVersion + 1), a.time(dc.UpdatedAt), dc.InstallDisk}
		if dw.PrevVersion > 0 {
			vals = append(vals, int64(dw.PrevVersion))
		}
		writes = append(writes, write{dc.Name, dw.PrevVersion, vals, dc.EKPins, dc})
	}
	changes := make([][]any, 0, len(w.Changes))
	for _, c := range w.Changes {
		changes = append(changes, []any{a.time(c.Time), c.Device, c.Field, c.Old, c.New, c.Actor, c.ActorRole, c.RequestID, c.Source})
	}
	auditVals := auditArgs(&a, w.Audit)
	if a.err != nil {
		return fmt.Errorf("apply inventory: %w", a.err)
	}
	err := d.write(ctx, func(t *wtx) error {
		for _, wr := range writes {
			q := qInsertDecl
			if wr.prev > 0 {
				q = qUpdateDecl
			}
			res, err := t.exec(q, wr.vals...)
			if err != nil {
				return fmt.Errorf("write declaration %s: %w", wr.name, err)
			}
			if err := mustChange(res, fmt.Errorf("declaration %s changed since version %d: %w", wr.name, wr.prev, store.ErrConflict)); err != nil {
				return err
			}
			if _, err := t.exec(qDeletePins, wr.name); err != nil {
				return fmt.Errorf("write declaration %s: %w", wr.name, err)
			}
			for _, p := range wr.pins {
				if _, err := t.exec(qInsertPin, wr.name, p); err != nil {
					return fmt.Errorf("write declaration %s: %w", wr.name, err)
				}
			}
			if _, err := t.exec(qDeclToNode, wr.name, wr.decl.Class); err != nil {
				return fmt.Errorf("write declaration %s: %w", wr.name, err)
			}
			if _, err := t.exec(qDeclToPlanned, wr.name, wr.decl.Role, wr.decl.Site); err != nil {
				return fmt.Errorf("write declaration %s: %w", wr.name, err)
			}
		}
		for _, c := range changes {
			if _, err := t.exec(qInsertChange, c...); err != nil {
				return fmt.Errorf("append changelog: %w", err)
			}
		}
		return insertAudit(t, auditVals)
	})
	if err != nil {
		return fmt.Errorf("apply inventory: %w", err)
	}
	return nil
}

// GetDeclaration returns one declaration; ErrNotFound if none.
func (d *DB) GetDeclaration(ctx context.Context, name string) (store.Declaration, error) {
	dc, err := scanDecl(d.queryRow(ctx, qGetDecl, name))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Declaration{}, fmt.Errorf("get declaration %q: %w", name, err)
	}
	return dc, nil
}

// ListDeclarations returns every declaration ordered by name.
func (d *DB) ListDeclarations(ctx context.Context) ([]store.Declaration, error) {
	ds, err := d.queryDecls(ctx, qListDecls)
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
	var a args
	list := a.list(serials)
	if a.err != nil {
		return nil, fmt.Errorf("declarations by claims: %w", a.err)
	}
	ds, err := d.queryDecls(ctx, qDeclsByClaim, productUUID, list)
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
	ds, err := d.queryDecls(ctx, qDeclsByPin, pin)
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
	rows, err := d.query(ctx, qChanges, device, limit)
	if err != nil {
		return nil, fmt.Errorf("list changes: %w", err)
	}
	defer rows.Close()
	var cs []store.FieldChange
	for rows.Next() {
		var (
			c  store.FieldChange
			at sql.NullInt64
		)
		if err := rows.Scan(&at, &c.Device, &c.Field, &c.Old, &c.New, &c.Actor, &c.ActorRole, &c.RequestID, &c.Source); err != nil {
			return nil, fmt.Errorf("list changes: %w", err)
		}
		c.Time = fromNanos(at)
		cs = append(cs, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list changes: %w", err)
	}
	return cs, nil
}

func (d *DB) queryDecls(ctx context.Context, q readQuery, vals ...any) ([]store.Declaration, error) {
	return queryAll(ctx, d, scanDecl, q, vals...)
}

func scanDecl(s scanner) (store.Declaration, error) {
	var (
		dc         store.Declaration
		macs, pins string
		version    int64
		updated    sql.NullInt64
	)
	if err := s.Scan(&dc.Name, &dc.Serial, &dc.ProductUUID, &macs, &dc.Class, &dc.Site, &dc.Role,
		&dc.SwitchChassis, &dc.SwitchPort, &pins, &dc.EKSource, &dc.EKReference, &version, &updated, &dc.InstallDisk); err != nil {
		return store.Declaration{}, err
	}
	var err error
	if dc.MACs, err = fromList(macs); err != nil {
		return store.Declaration{}, fmt.Errorf("declaration %q macs: %w", dc.Name, err)
	}
	if dc.EKPins, err = fromList(pins); err != nil {
		return store.Declaration{}, fmt.Errorf("declaration %q EK pins: %w", dc.Name, err)
	}
	dc.Version, dc.UpdatedAt = uint64(max(version, 0)), fromNanos(updated)
	return dc, nil
}
