package console

import (
	"context"
	"time"

	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/adminv1"
)

// certLimit is how many certificates the node page lists.
const certLimit = 20

// certRow is one certificate of the node page, its state in words.
type certRow struct {
	Serial     string
	Generation uint64
	Kind       string
	Issued     int64
	Expires    int64
	// Current marks the node's latest certificate.
	Current bool
	// State is "valid", "expired" or "revoked: reason".
	State   string
	Revoked int64
}

// certs lists the node's latest certificates, newest first, or a note
// saying why none are shown.
func (c *Console) certs(ctx context.Context, id, current string, now time.Time) ([]certRow, string) {
	resp, err := c.cfg.Admin.ListCerts(ctx, &adminv1.ListCertsRequest{NodeId: id, Limit: certLimit})
	if err != nil {
		return nil, "certificates not shown: " + status.Convert(err).Message()
	}
	if len(resp.Certs) == 0 {
		return nil, "no certificate was issued to this node"
	}
	out := make([]certRow, 0, len(resp.Certs))
	for _, ci := range resp.Certs {
		r := certRow{Serial: ci.Serial, Generation: ci.Generation, Kind: ci.Kind, Issued: ci.IssuedUnix, Expires: ci.NotAfterUnix,
			Current: ci.Serial == current, Revoked: ci.RevokedUnix, State: "valid"}
		switch {
		case ci.RevokedUnix != 0:
			r.State = "revoked"
			if ci.RevokedReason != "" {
				r.State += ": " + ci.RevokedReason
			}
		case ci.NotAfterUnix != 0 && !now.Before(time.Unix(ci.NotAfterUnix, 0)):
			r.State = "expired"
		}
		out = append(out, r)
	}
	return out, ""
}
