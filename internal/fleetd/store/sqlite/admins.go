package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const adminColumns = `serial, name, role, created_by, created_at, not_after, revoked_at, revoked_by`

var (
	qInsertAdmin = newWriteQuery(`INSERT INTO admins (` + adminColumns + `) VALUES (?, ?, ?, ?, ?, ?, NULL, '')
		ON CONFLICT DO NOTHING`)
	qRevokeAdmin = newWriteQuery(`UPDATE admins SET revoked_at = ?, revoked_by = ?
		WHERE name = ? AND revoked_at IS NULL RETURNING ` + adminColumns)
	qGetAdmin   = newReadQuery(`SELECT ` + adminColumns + ` FROM admins WHERE serial = ?`)
	qListAdmins = newReadQuery(`SELECT ` + adminColumns + ` FROM admins ORDER BY name, created_at, serial`)
)

// CreateAdmin records an admin credential; ErrConflict if its serial exists
// or an unrevoked credential has its name.
func (d *DB) CreateAdmin(ctx context.Context, c store.AdminCred, audit *store.AuditEvent) error {
	if c.Serial == "" || c.Name == "" || c.Role == "" {
		return fmt.Errorf("create admin %q: no serial, name or role", c.Name)
	}
	var a args
	vals := []any{c.Serial, c.Name, c.Role, c.CreatedBy, a.time(c.CreatedAt), a.time(c.NotAfter)}
	auditVals := auditArgs(&a, audit)
	if a.err != nil {
		return fmt.Errorf("create admin %s: %w", c.Name, a.err)
	}
	err := d.write(ctx, func(t *wtx) error {
		res, err := t.exec(qInsertAdmin, vals...)
		if err != nil {
			return err
		}
		if err := mustChange(res, fmt.Errorf("a credential with this serial, or an unrevoked one named %s, exists: %w", c.Name, store.ErrConflict)); err != nil {
			return err
		}
		return insertAudit(t, auditVals)
	})
	if err != nil {
		return fmt.Errorf("create admin %s: %w", c.Name, err)
	}
	return nil
}

// GetAdmin returns the credential with this serial; ErrNotFound if none.
func (d *DB) GetAdmin(ctx context.Context, serial string) (store.AdminCred, error) {
	c, err := scanAdmin(d.queryRow(ctx, qGetAdmin, serial))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.AdminCred{}, fmt.Errorf("get admin %s: %w", serial, err)
	}
	return c, nil
}

// ListAdmins returns every credential ordered by name, then CreatedAt.
func (d *DB) ListAdmins(ctx context.Context) ([]store.AdminCred, error) {
	cs, err := queryAll(ctx, d, scanAdmin, qListAdmins)
	if err != nil {
		return nil, fmt.Errorf("list admins: %w", err)
	}
	return cs, nil
}

// RevokeAdmin revokes the unrevoked credentials named name.
func (d *DB) RevokeAdmin(ctx context.Context, name, by string, now time.Time, audit *store.AuditEvent) ([]store.AdminCred, error) {
	var a args
	at := a.time(now)
	auditVals := auditArgs(&a, audit)
	if err := revokeArgs(a, at); err != nil {
		return nil, fmt.Errorf("revoke admin %s: %w", name, err)
	}
	var out []store.AdminCred
	err := d.write(ctx, func(t *wtx) error {
		rows, err := t.query(qRevokeAdmin, at, by, name)
		if err != nil {
			return err
		}
		for rows.Next() {
			c, err := scanAdmin(rows)
			if err != nil {
				rows.Close()
				return err
			}
			out = append(out, c)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		if len(out) == 0 {
			return store.ErrNotFound
		}
		return insertAudit(t, auditVals)
	})
	if err != nil {
		return nil, fmt.Errorf("revoke admin %s: %w", name, err)
	}
	return out, nil
}

func scanAdmin(s scanner) (store.AdminCred, error) {
	var (
		c                         store.AdminCred
		created, notAfter, revkAt sql.NullInt64
	)
	if err := s.Scan(&c.Serial, &c.Name, &c.Role, &c.CreatedBy, &created, &notAfter, &revkAt, &c.RevokedBy); err != nil {
		return store.AdminCred{}, err
	}
	c.CreatedAt, c.NotAfter, c.RevokedAt = fromNanos(created), fromNanos(notAfter), fromNanos(revkAt)
	return c, nil
}
