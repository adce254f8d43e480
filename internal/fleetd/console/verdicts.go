package console

import (
	"context"
	"errors"
	"time"
)

// Verdict is one boot check of a node: when, at which stage, against
// which class's policy, and the rules it failed with their reasons.
type Verdict struct {
	Time   time.Time
	Stage  string
	Class  string
	Passed bool
	Failed []FailedRule
}

// FailedRule is a rule a verdict failed and why.
type FailedRule struct {
	Rule   string
	Reason string
}

// VerdictSource gives a node's latest verdicts, newest first.
type VerdictSource interface {
	Verdicts(ctx context.Context, nodeID string, limit int) ([]Verdict, error)
}

// ErrNotRecorded is what a VerdictSource returns when the control plane
// keeps no verdicts.
var ErrNotRecorded = errors.New("boot checks are not recorded by this control plane")

// verdictLimit is how many verdicts the node page shows.
const verdictLimit = 10

// verdicts returns the node's last verdicts, or a note saying why there
// are none to show.
func (c *Console) verdicts(ctx context.Context, id string) ([]Verdict, string) {
	if c.cfg.Verdicts == nil {
		return nil, ErrNotRecorded.Error()
	}
	vs, err := c.cfg.Verdicts.Verdicts(ctx, id, verdictLimit)
	switch {
	case errors.Is(err, ErrNotRecorded):
		return nil, ErrNotRecorded.Error()
	case err != nil:
		return nil, "verdicts not shown: " + err.Error()
	case len(vs) == 0:
		return nil, "no boot check recorded for this node yet"
	}
	return vs, ""
}
