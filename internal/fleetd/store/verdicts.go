package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	// Matched is which state of the policy a passing verdict matched:
	// "current", "next" or "both" (inside a [next] window); empty for a
	// failed verdict (and for verdicts stored before it was recorded).
	Matched string
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
	// CountVerdictStatus takes the latest verdict (as ListVerdicts orders
	// them) of each node the store holds that is not retired, and counts
	// them per class (the verdict's), sorted by class. Nodes without a
	// verdict, and verdicts of nodes the store does not hold, are not
	// counted.
	CountVerdictStatus(ctx context.Context) ([]VerdictStatus, error)
}

// VerdictStatus counts a class's nodes by their latest stored verdict:
// how far the rollout of a [next] state has gone (fleetd policy status).
type VerdictStatus struct {
	Class string
	Nodes int
	// Current, Next and Both count the passing latest verdicts by
	// Verdict.Matched (a passing verdict without Matched counts as
	// Current); Failing the failed ones.
	Current, Next, Both, Failing int
	// Latest is the time of the newest verdict counted.
	Latest time.Time
}

// AddVerdictStatus counts n latest verdicts of class that passed (or not)
// and matched, the newest at latest, into the per-class counts by; the
// stores' CountVerdictStatus use it.
func AddVerdictStatus(by map[string]*VerdictStatus, class string, passed bool, matched string, n int, latest time.Time) {
	c := by[class]
	if c == nil {
		c = &VerdictStatus{Class: class}
		by[class] = c
	}
	c.Nodes += n
	switch {
	case !passed:
		c.Failing += n
	case matched == "next":
		c.Next += n
	case matched == "both":
		c.Both += n
	default:
		c.Current += n
	}
	if latest.After(c.Latest) {
		c.Latest = latest
	}
}

// SortedVerdictStatus returns the counts of by sorted by class.
func SortedVerdictStatus(by map[string]*VerdictStatus) []VerdictStatus {
	out := make([]VerdictStatus, 0, len(by))
	for _, c := range by {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b VerdictStatus) int { return strings.Compare(a.Class, b.Class) })
	return out
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
	// none was kept. DeleteNode removes a node's evidence with the node.
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
