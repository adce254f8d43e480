package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// RevokedNodes returns the nodes with a revoked, unexpired certificate,
// newest revocation first; it reads the certs_revoked_not_after index.
func (d *DB) RevokedNodes(ctx context.Context, now time.Time, limit int) ([]store.RevokedNode, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list revoked nodes: limit %d is not positive", limit)
	}
	rows, err := d.pool.Query(ctx, `SELECT node_id, max(revoked_at) AS r FROM certs
		WHERE revoked_at IS NOT NULL AND not_after > $1
		GROUP BY node_id ORDER BY r DESC, node_id LIMIT $2`, ts(now), limit)
	if err != nil {
		return nil, fmt.Errorf("list revoked nodes: %w", wrap(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.RevokedNode, error) {
		var (
			n  store.RevokedNode
			at *time.Time
		)
		err := r.Scan(&n.NodeID, &at)
		n.RevokedAt = fromTS(at)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("list revoked nodes: %w", wrap(err))
	}
	return out, nil
}
