package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/nodetrust/nodetrust/store"
)

// AppendAudit adds an audit event.
func (d *DB) AppendAudit(ctx context.Context, e store.AuditEvent) error {
	var a args
	at := a.time(e.Time)
	if a.err != nil {
		return fmt.Errorf("append audit event %s: %w", e.Action, a.err)
	}
	err := d.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO audit (time, actor, action, subject, detail)
			VALUES (?, ?, ?, ?, ?)`, at, e.Actor, e.Action, e.Subject, e.Detail)
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
	rows, err := d.r.QueryContext(ctx, `SELECT time, actor, action, subject, detail FROM audit
		ORDER BY time DESC NULLS LAST, seq DESC LIMIT ?`, limit)
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
