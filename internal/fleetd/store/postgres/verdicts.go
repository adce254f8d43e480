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

const verdictColumns = `node_id, time, stage, class, passed, failed, policy, nonce_sha256, quote_sha256, matched`

// AppendVerdict appends a verdict and keeps the node's keep most recent
// (see store.VerdictStore).
func (d *DB) AppendVerdict(ctx context.Context, v store.Verdict, keep int) error {
	if v.NodeID == "" {
		return errors.New("append verdict: no node id")
	}
	if keep < 1 {
		return fmt.Errorf("append verdict: keep %d is not positive", keep)
	}
	failed := v.Failed
	if failed == nil {
		failed = []store.FailedRule{}
	}
	fj, err := json.Marshal(failed)
	if err != nil {
		return fmt.Errorf("append verdict: %w", err)
	}
	err = d.tx(ctx, func(tx pgx.Tx) error {
		// One writer per node at a time keeps the bound exact.
		if err := lockNode(ctx, tx, v.NodeID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO verdicts (`+verdictColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			v.NodeID, ts(v.Time), v.Stage, v.Class, v.Passed, string(fj), v.Policy, v.NonceSHA256, v.QuoteSHA256, v.Matched); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM verdicts WHERE node_id = $1 AND seq NOT IN (
			SELECT seq FROM verdicts WHERE node_id = $1 ORDER BY seq DESC LIMIT $2)`, v.NodeID, keep)
		return err
	})
	if err != nil {
		return fmt.Errorf("append verdict of node %s: %w", v.NodeID, err)
	}
	return nil
}

// ListVerdicts returns a node's most recent verdicts, newest first.
func (d *DB) ListVerdicts(ctx context.Context, nodeID string, limit int) ([]store.Verdict, error) {
	if limit < 1 {
		return nil, fmt.Errorf("list verdicts: limit %d is not positive", limit)
	}
	rows, err := d.pool.Query(ctx, `SELECT `+verdictColumns+` FROM verdicts WHERE node_id = $1
		ORDER BY time DESC NULLS LAST, seq DESC LIMIT $2`, nodeID, limit)
	if err != nil {
		return nil, fmt.Errorf("list verdicts of node %s: %w", nodeID, wrap(err))
	}
	vs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Verdict, error) {
		var (
			v      store.Verdict
			at     *time.Time
			failed []byte
		)
		if err := r.Scan(&v.NodeID, &at, &v.Stage, &v.Class, &v.Passed, &failed, &v.Policy, &v.NonceSHA256, &v.QuoteSHA256, &v.Matched); err != nil {
			return v, err
		}
		if err := json.Unmarshal(failed, &v.Failed); err != nil {
			return v, fmt.Errorf("failed rules: %w", err)
		}
		if len(v.Failed) == 0 {
			v.Failed = nil
		}
		v.Time = fromTS(at)
		return v, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list verdicts of node %s: %w", nodeID, wrap(err))
	}
	return vs, nil
}

// CountVerdictStatus counts the nodes of each class by their latest
// verdict (see store.VerdictStore).
func (d *DB) CountVerdictStatus(ctx context.Context) ([]store.VerdictStatus, error) {
	rows, err := d.pool.Query(ctx, `SELECT v.class, v.passed, v.matched, count(*), max(v.time) FROM (
		SELECT node_id, class, passed, matched, time,
			row_number() OVER (PARTITION BY node_id ORDER BY time DESC NULLS LAST, seq DESC) AS rn
		FROM verdicts) v JOIN nodes n ON n.id = v.node_id
		WHERE v.rn = 1 AND n.state <> 'retired'
		GROUP BY v.class, v.passed, v.matched`)
	if err != nil {
		return nil, fmt.Errorf("count verdict status: %w", wrap(err))
	}
	defer rows.Close()
	by := map[string]*store.VerdictStatus{}
	for rows.Next() {
		var (
			class, matched string
			passed         bool
			n              int64
			latest         *time.Time
		)
		if err := rows.Scan(&class, &passed, &matched, &n, &latest); err != nil {
			return nil, fmt.Errorf("count verdict status: %w", wrap(err))
		}
		store.AddVerdictStatus(by, class, passed, matched, int(n), fromTS(latest))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count verdict status: %w", wrap(err))
	}
	return store.SortedVerdictStatus(by), nil
}
