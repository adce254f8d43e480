package store

import (
	"context"
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
