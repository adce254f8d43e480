package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// RevokedCerts returns the revoked certificates not expired at now, latest
// revocation first; it reads the certs_revoked_not_after index.
func (d *DB) RevokedCerts(ctx context.Context, now time.Time, limit int) ([]store.Cert, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list revoked certificates: limit %d is not positive", limit)
	}
	rows, err := d.pool.Query(ctx, `SELECT `+certColumns+` FROM certs
		WHERE revoked_at IS NOT NULL AND not_after > $1
		ORDER BY revoked_at DESC, serial LIMIT $2`, ts(now), limit)
	if err != nil {
		return nil, fmt.Errorf("list revoked certificates: %w", wrap(err))
	}
	certs, err := pgx.CollectRows(rows, scanCert)
	if err != nil {
		return nil, fmt.Errorf("list revoked certificates: %w", wrap(err))
	}
	return certs, nil
}
