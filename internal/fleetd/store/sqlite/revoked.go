package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// qRevokedCerts reads the certs_revoked_not_after index: only revoked
// certificates that have not expired.
var qRevokedCerts = newReadQuery(`SELECT ` + certColumns + ` FROM certs
	WHERE revoked_at IS NOT NULL AND not_after > ?
	ORDER BY revoked_at DESC, serial LIMIT ?`)

// RevokedCerts returns the revoked certificates not expired at now, latest
// revocation first.
func (d *DB) RevokedCerts(ctx context.Context, now time.Time, limit int) ([]store.Cert, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list revoked certificates: limit %d is not positive", limit)
	}
	rows, err := d.query(ctx, qRevokedCerts, now.UnixNano(), limit)
	if err != nil {
		return nil, fmt.Errorf("list revoked certificates: %w", err)
	}
	defer rows.Close()
	var certs []store.Cert
	for rows.Next() {
		var (
			c                         store.Cert
			gen                       int64
			issued, notAfter, revoked sql.NullInt64
		)
		if err := rows.Scan(&c.Serial, &c.NodeID, &gen, &c.Kind, &issued, &notAfter, &revoked, &c.RevokedReason); err != nil {
			return nil, fmt.Errorf("list revoked certificates: %w", err)
		}
		c.Generation = uint64(gen)
		c.IssuedAt, c.NotAfter, c.RevokedAt = fromNanos(issued), fromNanos(notAfter), fromNanos(revoked)
		certs = append(certs, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list revoked certificates: %w", err)
	}
	return certs, nil
}
