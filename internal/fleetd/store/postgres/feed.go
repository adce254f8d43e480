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

// revocationChannel is the NOTIFY channel of revocations.
const revocationChannel = "nodetrust_revocations"

// maxNotifiedReason bounds the reason in a notification (PostgreSQL's
// payload limit is 8000 bytes); the row keeps it whole.
const maxNotifiedReason = 1024

var _ store.RevocationFeed = (*DB)(nil)

// revocationMsg is a notification's payload and a catch-up row.
type revocationMsg struct {
	Seq        uint64    `json:"seq"`
	NodeID     string    `json:"node_id"`
	Generation uint64    `json:"generation"`
	Reason     string    `json:"reason"`
	At         time.Time `json:"at"`
}

// publishRevocation records a revocation in tx and sends its NOTIFY, which
// PostgreSQL delivers only if tx commits.
func publishRevocation(ctx context.Context, tx pgx.Tx, id string, g int64, reason string, at time.Time) error {
	_, err := tx.Exec(ctx, `WITH r AS (
			INSERT INTO revocations (node_id, generation, reason, at) VALUES ($1, $2, $3, $4)
			RETURNING seq, node_id, generation, reason, at)
		SELECT pg_notify($5, json_build_object('seq', seq, 'node_id', node_id, 'generation', generation,
			'reason', left(reason, $6), 'at', at)::text) FROM r`,
		id, g, reason, ts(at), revocationChannel, maxNotifiedReason)
	if err != nil {
		return fmt.Errorf("publish the revocation: %w", err)
	}
	return nil
}

// Timing of the revocation listener.
var (
	// listenIdle is how long the listener waits for a notification before
	// it checks its connection with a query: a connection whose peer
	// vanished may never report an error by itself.
	listenIdle = 10 * time.Second
	// catchUpMargin widens the catch-up read before the last moment the
	// listener knew its connection worked: a notification may have been
	// lost on a connection that had already failed unnoticed, and a
	// revocation's time is its replica's clock.
	catchUpMargin = time.Minute
	// retention is how long revocation rows are kept.
	retention = 7 * 24 * time.Hour
)

// WatchRevocations delivers every revocation committed after it starts,
// by any replica, to fn, until ctx ends (see store.RevocationFeed). It
// uses its own connection, outside the pool.
func (d *DB) WatchRevocations(ctx context.Context, fn func(store.Revocation), state func(error)) error {
	if state == nil {
		state = func(error) {}
	}
	var (
		last        uint64    // the highest seq delivered
		lastContact time.Time // when the connection was last known to work
		started     bool
		backoff     = 100 * time.Millisecond
	)
	for {
		err := d.listen(ctx, func(conn *pgx.Conn) error {
			if !started {
				// Revocations before the watch have no session to end
				// here: start from the newest.
				if err := conn.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM revocations`).Scan(&last); err != nil {
					return fmt.Errorf("read the newest revocation: %w", err)
				}
				started = true
			} else {
				if err := d.catchUp(ctx, conn, last, lastContact.Add(-catchUpMargin), func(r store.Revocation) {
					last = max(last, r.Seq)
					fn(r)
				}); err != nil {
					return err
				}
				state(nil)
			}
			backoff = 100 * time.Millisecond
			// Old rows are no longer needed for a catch-up.
			_, _ = conn.Exec(ctx, `DELETE FROM revocations WHERE at < $1`, time.Now().Add(-retention))
			return nil
		}, func(r store.Revocation) {
			last = max(last, r.Seq)
			fn(r)
		}, &lastContact)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		state(err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// listen opens a connection, LISTENs, runs ready (the catch-up read, after
// LISTEN so nothing committed in between is missed), then delivers
// notifications until the connection fails or ctx ends.
func (d *DB) listen(ctx context.Context, ready func(*pgx.Conn) error, fn func(store.Revocation), lastContact *time.Time) error {
	conn, err := pgx.ConnectConfig(ctx, d.cfg.ConnConfig)
	if err != nil {
		return fmt.Errorf("connect the revocation listener: %w", wrap(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+revocationChannel+"; LISTEN "+sessionChannel); err != nil {
		return fmt.Errorf("listen for revocations: %w", wrap(err))
	}
	if err := ready(conn); err != nil {
		return wrap(err)
	}
	*lastContact = time.Now()
	for {
		wctx, cancel := context.WithTimeout(ctx, listenIdle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = conn.Exec(pctx, "SELECT 1")
			cancel()
			if err != nil {
				return fmt.Errorf("revocation listener: %w", wrap(err))
			}
			*lastContact = time.Now()
			continue
		case err != nil:
			return fmt.Errorf("revocation listener: %w", wrap(err))
		}
		*lastContact = time.Now()
		if n.Channel == sessionChannel {
			d.deliverSessionMessage(n.Payload)
			continue
		}
		var m revocationMsg
		if err := json.Unmarshal([]byte(n.Payload), &m); err != nil || m.NodeID == "" {
			continue // not ours
		}
		fn(store.Revocation{Seq: m.Seq, NodeID: m.NodeID, Generation: m.Generation, Reason: m.Reason, At: m.At.UTC()})
	}
}

// catchUp delivers the revocations after seq last, and those made since
// since (a late commit may have a lower seq than one already delivered),
// in seq order.
func (d *DB) catchUp(ctx context.Context, conn *pgx.Conn, last uint64, since time.Time, fn func(store.Revocation)) error {
	rows, err := conn.Query(ctx, `SELECT seq, node_id, generation, reason, at FROM revocations
		WHERE seq > $1 OR at >= $2 ORDER BY seq`, int64(last), since.UTC())
	if err != nil {
		return fmt.Errorf("catch up on revocations: %w", err)
	}
	rs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Revocation, error) {
		var (
			rv     store.Revocation
			seq, g int64
		)
		err := r.Scan(&seq, &rv.NodeID, &g, &rv.Reason, &rv.At)
		rv.Seq, rv.Generation, rv.At = uint64(seq), uint64(g), rv.At.UTC()
		return rv, err
	})
	if err != nil {
		return fmt.Errorf("catch up on revocations: %w", err)
	}
	for _, r := range rs {
		fn(r)
	}
	return nil
}
