package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const evidenceColumns = `node_id, time, stage, class, passed, pcrs, event_log, ak_public, quote_attest, quote_signature, nonce`

var (
	qPutEvidence = newWriteQuery(`INSERT INTO boot_evidence (` + evidenceColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (node_id) DO UPDATE SET time = excluded.time, stage = excluded.stage, class = excluded.class,
		passed = excluded.passed, pcrs = excluded.pcrs, event_log = excluded.event_log, ak_public = excluded.ak_public,
		quote_attest = excluded.quote_attest, quote_signature = excluded.quote_signature, nonce = excluded.nonce`)
	qGetEvidence = newReadQuery(`SELECT ` + evidenceColumns + ` FROM boot_evidence WHERE node_id = ?`)
)

// PutBootEvidence stores a node's latest boot evidence, replacing the one
// before (see store.BootEvidenceStore).
func (d *DB) PutBootEvidence(ctx context.Context, e store.BootEvidence) error {
	if err := store.CheckBootEvidence(e); err != nil {
		return fmt.Errorf("put boot evidence: %w", err)
	}
	pcrs, err := json.Marshal(e.PCRs)
	if err != nil {
		return fmt.Errorf("put boot evidence of node %s: %w", e.NodeID, err)
	}
	var a args
	vals := []any{e.NodeID, a.time(e.Time), e.Stage, e.Class, e.Passed, string(pcrs),
		notNil(e.EventLog), notNil(e.AKPublic), notNil(e.QuoteAttest), notNil(e.QuoteSignature), notNil(e.Nonce)}
	if a.err != nil {
		return fmt.Errorf("put boot evidence of node %s: %w", e.NodeID, a.err)
	}
	err = d.write(ctx, func(t *wtx) error {
		_, err := t.exec(qPutEvidence, vals...)
		return err
	})
	if err != nil {
		return fmt.Errorf("put boot evidence of node %s: %w", e.NodeID, err)
	}
	return nil
}

// GetBootEvidence returns a node's latest boot evidence; store.ErrNotFound
// when none was kept.
func (d *DB) GetBootEvidence(ctx context.Context, nodeID string) (store.BootEvidence, error) {
	var (
		e    store.BootEvidence
		at   sql.NullInt64
		pcrs string
	)
	err := d.queryRow(ctx, qGetEvidence, nodeID).Scan(&e.NodeID, &at, &e.Stage, &e.Class, &e.Passed, &pcrs,
		&e.EventLog, &e.AKPublic, &e.QuoteAttest, &e.QuoteSignature, &e.Nonce)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.BootEvidence{}, fmt.Errorf("boot evidence of node %s: %w", nodeID, err)
	}
	if err := json.Unmarshal([]byte(pcrs), &e.PCRs); err != nil {
		return store.BootEvidence{}, fmt.Errorf("boot evidence of node %s: PCR values: %w", nodeID, err)
	}
	e.Time = fromNanos(at)
	return e, nil
}

// notNil stores an absent byte string as an empty one.
func notNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
