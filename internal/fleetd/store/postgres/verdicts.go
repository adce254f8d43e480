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

const verdictColumns = `node_id, time, stage, class, passed, failed, policy, nonce_sha256, quote_sha256`

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
		if _, err := tx.Exec(ctx, `INSERT INTO verdicts (`+verdictColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			v.NodeID, ts(v.Time), v.Stage, v.Class, v.Passed, string(fj), v.Policy, v.NonceSHA256, v.QuoteSHA256); err != nil {
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
		if err := r.Scan(&v.NodeID, &at, &v.Stage, &v.Class, &v.Passed, &failed, &v.Policy, &v.NonceSHA256, &v.QuoteSHA256); err != nil {
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
