package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// sessionChannel is the NOTIFY channel of messages between replicas about
// live sessions; the revocation listener's connection listens on it too.
const sessionChannel = "nodetrust_sessions"

var _ store.SessionRegistry = (*DB)(nil)

// ClaimSession records s as the node's live session and returns the one it
// replaces, if any. The row lock makes concurrent claims of one node, on
// any replicas, take turns, so each sees the one before.
func (d *DB) ClaimSession(ctx context.Context, s store.LiveSession) (prev store.LiveSession, found bool, err error) {
	err = d.tx(ctx, func(tx pgx.Tx) error {
		prev, found = store.LiveSession{NodeID: s.NodeID}, true
		err := tx.QueryRow(ctx, `SELECT instance, replica FROM live_sessions WHERE node_id = $1 FOR UPDATE`, s.NodeID).
			Scan(&prev.Instance, &prev.Replica)
		if errors.Is(err, pgx.ErrNoRows) {
			found = false
		} else if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO live_sessions (node_id, instance, replica, opened_at) VALUES ($1, $2, $3, $4)
			ON CONFLICT (node_id) DO UPDATE SET instance = excluded.instance, replica = excluded.replica, opened_at = excluded.opened_at`,
			s.NodeID, s.Instance, s.Replica, time.Now().UTC())
		return err
	})
	if err != nil {
		return store.LiveSession{}, false, fmt.Errorf("claim the session of node %q: %w", s.NodeID, err)
	}
	return prev, found, nil
}

// ReleaseSession forgets s, if it is still the node's live session.
func (d *DB) ReleaseSession(ctx context.Context, s store.LiveSession) error {
	if _, err := d.pool.Exec(ctx, `DELETE FROM live_sessions WHERE node_id = $1 AND instance = $2 AND replica = $3`,
		s.NodeID, s.Instance, s.Replica); err != nil {
		return fmt.Errorf("release the session of node %q: %w", s.NodeID, wrap(err))
	}
	return nil
}

// SendSessionMessage sends m to every replica's listener.
func (d *DB) SendSessionMessage(ctx context.Context, m store.SessionMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("send a session message: %w", err)
	}
	if _, err := d.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, sessionChannel, string(b)); err != nil {
		return fmt.Errorf("send a session message: %w", wrap(err))
	}
	return nil
}

// HandleSessionMessages sets the function the listener gives session
// messages to.
func (d *DB) HandleSessionMessages(fn func(store.SessionMessage)) { d.onSession.Store(&fn) }

func (d *DB) deliverSessionMessage(payload string) {
	fn := d.onSession.Load()
	if fn == nil {
		return
	}
	var m store.SessionMessage
	if err := json.Unmarshal([]byte(payload), &m); err != nil || m.NodeID == "" {
		return
	}
	(*fn)(m)
}
