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

const evidenceColumns = `node_id, time, stage, class, passed, pcrs, event_log, ak_public, quote_attest, quote_signature, nonce`

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
	_, err = d.pool.Exec(ctx, `INSERT INTO boot_evidence (`+evidenceColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
		ON CONFLICT (node_id) DO UPDATE SET time = excluded.time, stage = excluded.stage, class = excluded.class,
		passed = excluded.passed, pcrs = excluded.pcrs, event_log = excluded.event_log, ak_public = excluded.ak_public,
		quote_attest = excluded.quote_attest, quote_signature = excluded.quote_signature, nonce = excluded.nonce`,
		e.NodeID, ts(e.Time), e.Stage, e.Class, e.Passed, string(pcrs),
		notNil(e.EventLog), notNil(e.AKPublic), notNil(e.QuoteAttest), notNil(e.QuoteSignature), notNil(e.Nonce))
	if err != nil {
		return fmt.Errorf("put boot evidence of node %s: %w", e.NodeID, wrap(err))
	}
	return nil
}

// GetBootEvidence returns a node's latest boot evidence; store.ErrNotFound
// when none was kept.
func (d *DB) GetBootEvidence(ctx context.Context, nodeID string) (store.BootEvidence, error) {
	var (
		e    store.BootEvidence
		at   *time.Time
		pcrs []byte
	)
	err := d.pool.QueryRow(ctx, `SELECT `+evidenceColumns+` FROM boot_evidence WHERE node_id = $1`, nodeID).
		Scan(&e.NodeID, &at, &e.Stage, &e.Class, &e.Passed, &pcrs, &e.EventLog, &e.AKPublic, &e.QuoteAttest, &e.QuoteSignature, &e.Nonce)
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.BootEvidence{}, fmt.Errorf("boot evidence of node %s: %w", nodeID, wrap(err))
	}
	if err := json.Unmarshal(pcrs, &e.PCRs); err != nil {
		return store.BootEvidence{}, fmt.Errorf("boot evidence of node %s: PCR values: %w", nodeID, err)
	}
	e.Time = fromTS(at)
	return e, nil
}

// notNil stores an absent byte string as an empty one.
func notNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
