package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// qRevokedNodes reads the certs_revoked_not_after index: only revoked
// certificates that have not expired.
var qRevokedNodes = newReadQuery(`SELECT node_id, max(revoked_at) AS r FROM certs
	WHERE revoked_at IS NOT NULL AND not_after > ?
	GROUP BY node_id ORDER BY r DESC, node_id LIMIT ?`)

// RevokedNodes returns the nodes with a revoked, unexpired certificate,
// newest revocation first.
func (d *DB) RevokedNodes(ctx context.Context, now time.Time, limit int) ([]store.RevokedNode, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list revoked nodes: limit %d is not positive", limit)
	}
	rows, err := d.query(ctx, qRevokedNodes, now.UnixNano(), limit)
	if err != nil {
		return nil, fmt.Errorf("list revoked nodes: %w", err)
	}
	defer rows.Close()
	var out []store.RevokedNode
	for rows.Next() {
		var (
			r  store.RevokedNode
			at sql.NullInt64
		)
		if err := rows.Scan(&r.NodeID, &at); err != nil {
			return nil, fmt.Errorf("list revoked nodes: %w", err)
		}
		r.RevokedAt = fromNanos(at)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list revoked nodes: %w", err)
	}
	return out, nil
}
