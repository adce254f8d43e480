package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const auditInsert = `INSERT INTO audit (time, actor, action, subject, detail) VALUES ($1, $2, $3, $4, $5)`

// insertAudit appends e in tx; nothing for nil.
func insertAudit(ctx context.Context, tx pgx.Tx, e *store.AuditEvent) error {
	if e == nil {
		return nil
	}
	if _, err := tx.Exec(ctx, auditInsert, ts(e.Time), e.Actor, e.Action, e.Subject, e.Detail); err != nil {
		return fmt.Errorf("append audit event: %w", err)
	}
	return nil
}

// AppendAudit adds an audit event.
func (d *DB) AppendAudit(ctx context.Context, e store.AuditEvent) error {
	if _, err := d.pool.Exec(ctx, auditInsert, ts(e.Time), e.Actor, e.Action, e.Subject, e.Detail); err != nil {
		return fmt.Errorf("append audit event %s: %w", e.Action, wrap(err))
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
	rows, err := d.pool.Query(ctx, `SELECT time, actor, action, subject, detail FROM audit
		ORDER BY time DESC NULLS LAST, seq DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", wrap(err))
	}
	es, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.AuditEvent, error) {
		var (
			e  store.AuditEvent
			at *time.Time
		)
		err := r.Scan(&at, &e.Actor, &e.Action, &e.Subject, &e.Detail)
		e.Time = fromTS(at)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", wrap(err))
	}
	return es, nil
}
