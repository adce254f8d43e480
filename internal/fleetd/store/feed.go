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
	// (RevokeNode, DeleteNode) committed by any process after the watch
	// started, until ctx ends; then it returns ctx's error. When it loses
	// the database it reconnects, and before it listens again it delivers
	// the revocations committed meanwhile, so a lost notification is not
	// a lost revocation; fn may therefore see a revocation twice and must
	// be idempotent. state, when not nil, is told each loss (with its
	// error) and each return (nil) of the connection, for the log.
	WatchRevocations(ctx context.Context, fn func(Revocation), state func(err error)) error
}
