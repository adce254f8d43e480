package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Verdict is one boot-policy verdict of a node as the verdict history keeps
// it (internal/fleetd/bootpolicy makes them; verdicts.jsonl keeps them
// whole). Only TPM-proven evidence makes a verdict.
type Verdict struct {
	NodeID string
	Time   time.Time
	// Stage is when the boot was evaluated: intake, renewal or
	// boot-check.
	Stage string
	Class string
	// Passed is true when every rule passed.
	Passed bool
	// Failed are the rules that failed, each with its reason.
	Failed []FailedRule
	// Policy is the SHA-256 of the policy version that decided.
	Policy string
	// NonceSHA256 and QuoteSHA256 identify the evidence: the SHA-256 of
	// the server's nonce and of the quote (TPMS_ATTEST), lower-case hex.
	NonceSHA256 string
	QuoteSHA256 string
}

// FailedRule is one rule a verdict failed, and why.
type FailedRule struct {
	Rule   string `json:"rule"`
	Reason string `json:"reason"`
}

// VerdictStore keeps each node's verdict history, bounded per node. It is
// part of [Store].
type VerdictStore interface {
	// AppendVerdict appends v to the history of v.NodeID and removes all
	// but that node's keep most recent verdicts (keep < 1 is an error;
	// so is an empty NodeID).
	AppendVerdict(ctx context.Context, v Verdict, keep int) error
	// ListVerdicts returns at most limit verdicts of a node, the most
	// recent first (the latest appended first among equal times); none
	// for an unknown node. A limit below 1 is an error.
	ListVerdicts(ctx context.Context, nodeID string, limit int) ([]Verdict, error)
}

// MaxEvidenceLogSize bounds the event log of a node's kept boot evidence:
// attest.MaxEventLogSize, the largest log a verdict is made of (a test in
// internal/fleetd/service holds the two equal).
const MaxEvidenceLogSize = 2 << 20

// MaxEvidencePCRs bounds the PCR values of kept boot evidence: a PC
// client TPM has 24.
const MaxEvidencePCRs = 24

// BootEvidence is a node's last TPM-proven boot evidence: the quote, the
// PCR values it covers and the event log, as fleetd verified them when it
// made the verdict of Stage at Time. fleetd policy capture --node writes a
// policy from it. A store keeps one per node, the latest.
type BootEvidence struct {
	NodeID string
	Time   time.Time
	// Stage, Class and Passed are those of the verdict the evidence made.
	Stage  string
	Class  string
	Passed bool
	// PCRs are the quoted SHA-256 PCR values by index.
	PCRs map[int][]byte
	// EventLog is the TCG measurement log, at most MaxEvidenceLogSize.
	EventLog []byte
	// The quote: the AK's public area (TPMT_PUBLIC), the quoted
	// TPMS_ATTEST, its signature (TPMT_SIGNATURE) and the server's nonce.
	AKPublic, QuoteAttest, QuoteSignature, Nonce []byte
}

// BootEvidenceStore keeps each node's latest boot evidence. It is part of
// [Store].
type BootEvidenceStore interface {
	// PutBootEvidence stores e as the latest evidence of e.NodeID,
	// replacing the one before. An empty NodeID, an event log over
	// MaxEvidenceLogSize or more than MaxEvidencePCRs PCR values is an
	// error, and nothing is stored.
	PutBootEvidence(ctx context.Context, e BootEvidence) error
	// GetBootEvidence returns a node's latest evidence; ErrNotFound when
	// none was kept.
	GetBootEvidence(ctx context.Context, nodeID string) (BootEvidence, error)
}

// CheckBootEvidence reports why e cannot be stored, or nil; the stores
// call it first.
func CheckBootEvidence(e BootEvidence) error {
	switch {
	case e.NodeID == "":
		return errors.New("boot evidence without a node id")
	case len(e.EventLog) > MaxEvidenceLogSize:
		return fmt.Errorf("the event log of node %s is %d bytes, over the %d kept", e.NodeID, len(e.EventLog), MaxEvidenceLogSize)
	case len(e.PCRs) > MaxEvidencePCRs:
		return fmt.Errorf("node %s's evidence has %d PCR values, over %d", e.NodeID, len(e.PCRs), MaxEvidencePCRs)
	}
	return nil
}
