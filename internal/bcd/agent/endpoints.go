package agent

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki"
)

// learnEndpoints adds the control-plane addresses the well-known document
// names to the connection's, so a node configured with one address finds
// the other replicas. The document comes over the pinned connection; a
// failure to fetch it changes nothing (the session's own retry follows).
func (n *node) learnEndpoints(ctx context.Context, client joinv1.JoinServiceClient, ep *Endpoints) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := client.GetWellKnown(ctx, &joinv1.GetWellKnownRequest{})
	if err != nil {
		return
	}
	var doc pki.WellKnown
	if err := json.Unmarshal(resp.Document, &doc); err != nil || doc.ServingCASPKIPin != n.c.Pins.ServingCA.String() {
		return
	}
	before := len(ep.List())
	ep.Add(doc.Servers...)
	if after := ep.List(); len(after) != before {
		n.log.InfoContext(ctx, "control plane addresses", "servers", after)
	}
}
