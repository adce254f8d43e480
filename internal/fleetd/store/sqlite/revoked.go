package sqlite

import (
	"context"
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
	certs, err := queryAll(ctx, d, scanCert, qRevokedCerts, now.UnixNano(), limit)
	if err != nil {
		return nil, fmt.Errorf("list revoked certificates: %w", err)
	}
	return certs, nil
}
