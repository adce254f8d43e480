package service

import (
	"context"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// watchRevocations ends the live sessions this replica holds of nodes that
// another replica revoked (DESIGN.md §3: a revocation reaches every
// replica's live sessions), when the store is shared (store.RevocationFeed).
// It runs until ctx ends. The store reconnects by itself and catches up on
// what it missed.
func (s *Server) watchRevocations(ctx context.Context) {
	feed, ok := s.cfg.Store.(store.RevocationFeed)
	if !ok {
		return
	}
	_ = feed.WatchRevocations(ctx, func(r store.Revocation) {
		notice := &gatewayv1.RevocationNotice{Reason: r.Reason, IdentityGeneration: r.Generation}
		if s.sessions.notifyOlder(r.NodeID, r.Generation, notice) {
			s.log.InfoContext(ctx, "session ended by a revocation from another replica", logkey.NodeID, r.NodeID, logkey.Generation, r.Generation, logkey.Reason, r.Reason)
		}
	}, func(err error) {
		if err != nil {
			s.log.WarnContext(ctx, "revocation feed lost; reconnecting, then catching up", logkey.Error, err)
			return
		}
		s.log.InfoContext(ctx, "revocation feed back; caught up")
	})
}
