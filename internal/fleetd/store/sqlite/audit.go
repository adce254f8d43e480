package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var (
	qInsertAudit = newWriteQuery(`INSERT INTO audit (time, actor, action, subject, detail)
		VALUES (?, ?, ?, ?, ?)`)
	qListAudit = newReadQuery(`SELECT time, actor, action, subject, detail FROM audit
		ORDER BY time DESC NULLS LAST, seq DESC LIMIT ?`)
)

// auditArgs returns the column values of e, or nil for no event.
func auditArgs(a *args, e *store.AuditEvent) []any {
	if e == nil {
		return nil
	}
	return []any{a.time(e.Time), e.Actor, e.Action, e.Subject, e.Detail}
}

// insertAudit appends the event whose column values auditArgs made;
// nothing for nil.
func insertAudit(t *wtx, vals []any) error {
	if vals == nil {
		return nil
	}
	if _, err := t.exec(qInsertAudit, vals...); err != nil {
		return fmt.Errorf("append audit event: %w", err)
	}
	return nil
}

// AppendAudit adds an audit event.
func (d *DB) AppendAudit(ctx context.Context, e store.AuditEvent) error {
	var a args
	vals := auditArgs(&a, &e)
	if a.err != nil {
		return fmt.Errorf("append audit event %s: %w", e.Action, a.err)
	}
	err := d.write(ctx, func(t *wtx) error {
		_, err := t.exec(qInsertAudit, vals...)
		return err
	})
	if err != nil {
		return fmt.Errorf("append audit event %s: %w", e.Action, err)
	}
	return nil
}

// ListAudit returns at most limit audit events, the most recent first:
// ordered by Time, latest first, and events of the same Time in reverse
// order of appending. A limit below 1 is an error.
func (d *DB) ListAudit(ctx context.Context, limit int) ([]store.AuditEvent, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list audit: limit %d is not positive", limit)
	}
	rows, err := d.query(ctx, qListAudit, limit)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	defer rows.Close()
	var es []store.AuditEvent
	for rows.Next() {
		var (
			e  store.AuditEvent
			at sql.NullInt64
		)
		if err := rows.Scan(&at, &e.Actor, &e.Action, &e.Subject, &e.Detail); err != nil {
			return nil, fmt.Errorf("list audit: %w", err)
		}
		e.Time = fromNanos(at)
		es = append(es, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	return es, nil
}
