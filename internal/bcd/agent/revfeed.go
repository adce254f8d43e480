package agent

import (
	"context"
	"time"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
)

// revocationFeedRequest is the session's subscription to fleetd's
// revocation feed, with request id id, or nil when nothing takes the
// revoked certificates (NodeConfig.PeerRevoked is nil): the feed is then
// not asked for, and costs the control plane nothing.
func (n *node) revocationFeedRequest(id uint64) *gatewayv1.SessionRequest {
	if n.c.PeerRevoked == nil {
		return nil
	}
	return &gatewayv1.SessionRequest{Id: id, Body: &gatewayv1.SessionRequest_RevocationFeed{RevocationFeed: &gatewayv1.RevocationFeedRequest{}}}
}

// peersRevoked hands the certificates of a RevokedCerts to PeerRevoked.
// A catch-up adds to what the daemon knows: a certificate it heard of
// before and that the catch-up no longer lists has expired.
func (n *node) peersRevoked(ctx context.Context, rc *gatewayv1.RevokedCerts) {
	if n.c.PeerRevoked == nil {
		return
	}
	for _, c := range rc.GetCerts() {
		if c.GetNodeId() == "" || c.GetSerial() == "" {
			continue
		}
		var notAfter time.Time
		if ns := c.GetNotAfterUnixNano(); ns != 0 {
			notAfter = time.Unix(0, ns)
		}
		n.c.PeerRevoked(c.GetNodeId(), c.GetSerial(), notAfter)
	}
	if rc.GetTruncated() {
		n.log.WarnContext(ctx, "the control plane's list of revoked certificates was cut at its bound: calls made with the oldest revoked certificates may still be accepted until they expire", "certificates", len(rc.GetCerts()))
	}
	if len(rc.GetCerts()) > 0 {
		n.log.InfoContext(ctx, "revoked certificates of other nodes", "certificates", len(rc.GetCerts()), "catch_up", rc.GetCatchUp())
	}
}
