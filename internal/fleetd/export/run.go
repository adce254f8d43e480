package export

import "strings"

// Run outcomes.
const (
	// OutcomeApplied: the run changed the SPIRE server.
	OutcomeApplied = "applied"
	// OutcomeUnchanged: the SPIRE server already matched the export.
	OutcomeUnchanged = "unchanged"
	// OutcomeHeld: a safeguard held the change back; nothing changed.
	OutcomeHeld = "held"
	// OutcomeFailed: the run could not finish (some changes may be done;
	// Errors say which failed).
	OutcomeFailed = "failed"
)

// Hold reasons.
const (
	HeldEmpty     = "empty"
	HeldMalformed = "malformed"
	HeldThreshold = "threshold"
)

// Run is what one applier run did and held back, as it is recorded (audit
// trail, metrics, held changes).
type Run struct {
	Digest  string `json:"digest"`
	Outcome string `json:"outcome"`
	// HeldReason is one of the Held* names when Outcome is held; Held
	// says why in words, with what to do next.
	HeldReason string `json:"held_reason,omitempty"`
	Held       string `json:"held,omitempty"`
	Create     int    `json:"create"`
	Update     int    `json:"update"`
	Delete     int    `json:"delete"`
	Ban        int    `json:"ban"`
	Kept       int    `json:"kept"`
	Pending    int    `json:"pending"`
	// Nodes are the nodes withdrawn or banned (or that would have been).
	Nodes   []string `json:"nodes"`
	Summary string   `json:"summary"`
	Errors  []string `json:"errors,omitempty"`
}

// Bounds of a Run as it is recorded.
const (
	maxRunText   = 1024
	maxRunNodes  = 1000
	maxRunErrors = 20
)

// Bounded returns r with its text and lists cut to what a record keeps.
func (r Run) Bounded() Run {
	cut := func(s string) string {
		if len(s) > maxRunText {
			return s[:maxRunText] + "…"
		}
		return strings.ToValidUTF8(s, "?")
	}
	r.Held, r.Summary, r.Digest, r.HeldReason, r.Outcome = cut(r.Held), cut(r.Summary), cut(r.Digest), cut(r.HeldReason), cut(r.Outcome)
	if len(r.Nodes) > maxRunNodes {
		r.Nodes = r.Nodes[:maxRunNodes]
	}
	if len(r.Errors) > maxRunErrors {
		r.Errors = r.Errors[:maxRunErrors]
	}
	for i := range r.Errors {
		r.Errors[i] = cut(r.Errors[i])
	}
	for i := range r.Nodes {
		r.Nodes[i] = cut(r.Nodes[i])
	}
	return r
}
