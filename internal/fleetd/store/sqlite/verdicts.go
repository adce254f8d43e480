package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const verdictColumns = `node_id, time, stage, class, passed, failed, policy, nonce_sha256, quote_sha256, matched`

var (
	qInsertVerdict = newWriteQuery(`INSERT INTO verdicts (` + verdictColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	// qTrimVerdicts removes a node's verdicts past the newest ?2.
	qTrimVerdicts = newWriteQuery(`DELETE FROM verdicts WHERE node_id = ?1 AND seq NOT IN (
		SELECT seq FROM verdicts WHERE node_id = ?1 ORDER BY seq DESC LIMIT ?2)`)
	qListVerdicts = newReadQuery(`SELECT ` + verdictColumns + ` FROM verdicts WHERE node_id = ?
		ORDER BY time DESC NULLS LAST, seq DESC LIMIT ?`)
	// qVerdictStatus counts the latest verdicts of the nodes held, not
	// retired, by class, result and the state matched.
	qVerdictStatus = newReadQuery(`SELECT v.class, v.passed, v.matched, count(*), max(v.time) FROM (
		SELECT node_id, class, passed, matched, time,
			row_number() OVER (PARTITION BY node_id ORDER BY time DESC NULLS LAST, seq DESC) AS rn
		FROM verdicts) v JOIN nodes n ON n.id = v.node_id
		WHERE v.rn = 1 AND n.state <> 'retired'
		GROUP BY v.class, v.passed, v.matched`)
)

// AppendVerdict appends a verdict and keeps the node's keep most recent
// (see store.VerdictStore).
func (d *DB) AppendVerdict(ctx context.Context, v store.Verdict, keep int) error {
	if v.NodeID == "" {
		return errors.New("append verdict: no node id")
	}
	if keep < 1 {
		return fmt.Errorf("append verdict: keep %d is not positive", keep)
	}
	failed, err := json.Marshal(nonNil(v.Failed))
	if err != nil {
		return fmt.Errorf("append verdict: %w", err)
	}
	var a args
	vals := []any{v.NodeID, a.time(v.Time), v.Stage, v.Class, v.Passed, string(failed), v.Policy, v.NonceSHA256, v.QuoteSHA256, v.Matched}
	if a.err != nil {
		return fmt.Errorf("append verdict: %w", a.err)
	}
	err = d.write(ctx, func(t *wtx) error {
		if _, err := t.exec(qInsertVerdict, vals...); err != nil {
			return err
		}
		_, err := t.exec(qTrimVerdicts, v.NodeID, keep)
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
	rows, err := d.query(ctx, qListVerdicts, nodeID, limit)
	if err != nil {
		return nil, fmt.Errorf("list verdicts of node %s: %w", nodeID, err)
	}
	defer rows.Close()
	var vs []store.Verdict
	for rows.Next() {
		var (
			v      store.Verdict
			at     sql.NullInt64
			failed string
		)
		if err := rows.Scan(&v.NodeID, &at, &v.Stage, &v.Class, &v.Passed, &failed, &v.Policy, &v.NonceSHA256, &v.QuoteSHA256, &v.Matched); err != nil {
			return nil, fmt.Errorf("list verdicts of node %s: %w", nodeID, err)
		}
		if err := json.Unmarshal([]byte(failed), &v.Failed); err != nil {
			return nil, fmt.Errorf("list verdicts of node %s: failed rules: %w", nodeID, err)
		}
		if len(v.Failed) == 0 {
			v.Failed = nil
		}
		v.Time = fromNanos(at)
		vs = append(vs, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list verdicts of node %s: %w", nodeID, err)
	}
	return vs, nil
}

// CountVerdictStatus counts the nodes of each class by their latest
// verdict (see store.VerdictStore).
func (d *DB) CountVerdictStatus(ctx context.Context) ([]store.VerdictStatus, error) {
	rows, err := d.query(ctx, qVerdictStatus)
	if err != nil {
		return nil, fmt.Errorf("count verdict status: %w", err)
	}
	defer rows.Close()
	by := map[string]*store.VerdictStatus{}
	for rows.Next() {
		var (
			class, matched string
			passed         bool
			n              int
			latest         sql.NullInt64
		)
		if err := rows.Scan(&class, &passed, &matched, &n, &latest); err != nil {
			return nil, fmt.Errorf("count verdict status: %w", err)
		}
		store.AddVerdictStatus(by, class, passed, matched, n, fromNanos(latest))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count verdict status: %w", err)
	}
	return store.SortedVerdictStatus(by), nil
}

func nonNil(f []store.FailedRule) []store.FailedRule {
	if f == nil {
		return []store.FailedRule{}
	}
	return f
}
