package store

import (
	"context"
	"time"
)

// Revocation is one revocation as a store shared by several fleetd
// processes recorded it: the node, the identity generation its
// revocation raised it to, and why.
type Revocation struct {
	Seq        uint64
	NodeID     string
	Generation uint64
	Reason     string
	At         time.Time
}

// RevocationFeed is implemented by a store that several fleetd processes
// share (PostgreSQL): a revocation made through one of them must reach the
// live sessions the others hold. The embedded SQLite store serves one
// process and does not implement it.
type RevocationFeed interface {
	// WatchRevocations calls fn, from one goroutine, for each revocation
	// (RevokeNode, DeleteNode, a TransitionNode that revokes, and a
	// reclaim by CompleteJoin, whose Generation is the reclaiming
	// node's) committed by any process after the watch
	// started, until ctx ends; then it returns ctx's error. When it loses
	// the database it reconnects, and before it listens again it delivers
	// the revocations committed meanwhile, so a lost notification is not
	// a lost revocation; fn may therefore see a revocation twice and must
	// be idempotent. state, when not nil, is told each loss (with its
	// error) and each return (nil) of the connection, for the log.
	WatchRevocations(ctx context.Context, fn func(Revocation), state func(err error)) error
}

// LiveSession names a node's live session: the bcd process instance that
// holds it and the fleetd replica it is held on.
type LiveSession struct {
	NodeID   string
	Instance string
	Replica  string
}

// Kinds of SessionMessage.
const (
	// SessionProbe asks replica To whether it still holds the session of
	// NodeID from Instance, and whether the node answers on it.
	SessionProbe = "probe"
	// SessionAlive and SessionGone answer probe ID.
	SessionAlive = "alive"
	SessionGone  = "gone"
	// SessionReplaced tells replica To that the session of NodeID from
	// Instance was taken over elsewhere: it ends it, if it still holds it.
	SessionReplaced = "replaced"
)

// SessionMessage is a message between replicas about one live session.
type SessionMessage struct {
	Kind     string `json:"kind"`
	ID       string `json:"id,omitempty"`
	NodeID   string `json:"node_id"`
	Instance string `json:"instance"`
	From     string `json:"from"`
	To       string `json:"to"`
}

// SessionRegistry is implemented by a store that several fleetd processes
// share (PostgreSQL), so that clone detection (two live sessions of one
// certificate at once) works when the two sessions are on two replicas.
type SessionRegistry interface {
	// ClaimSession records s as the node's live session and returns the
	// one it replaces, if any.
	ClaimSession(ctx context.Context, s LiveSession) (prev LiveSession, found bool, err error)
	// ReleaseSession forgets s, if it is still the node's live session.
	ReleaseSession(ctx context.Context, s LiveSession) error
	// SendSessionMessage sends m to every replica (m.To is the one it is
	// for).
	SendSessionMessage(ctx context.Context, m SessionMessage) error
	// HandleSessionMessages sets the function WatchRevocations calls, from
	// its goroutine, with each session message; call it before the watch
	// starts.
	HandleSessionMessages(fn func(SessionMessage))
}
