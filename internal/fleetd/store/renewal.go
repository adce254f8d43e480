package store

import (
	"fmt"
	"time"
)

// RenewalLimit is how many renewals of one node a store lets through in
// any window of time (RecordRenewalLimited).
type RenewalLimit struct {
	// Max renewals (certificates of kind "renew") are allowed in any
	// Window; Max must be at least 1 and Window positive.
	Max    int
	Window time.Duration
}

// Check says what is wrong with a limit, or nil.
func (l RenewalLimit) Check() error {
	if l.Max < 1 || l.Window <= 0 {
		return fmt.Errorf("renewal limit of %d in %s: want at least 1 in a positive window", l.Max, l.Window)
	}
	return nil
}

// RenewalLimitError is the refusal of a renewal that would go over the
// node's renewal limit. Nothing was written.
type RenewalLimitError struct {
	NodeID string
	// Count is how many renewals of the node are in the window that ends
	// at the refused renewal's IssuedAt.
	Count int
	Limit RenewalLimit
	// RetryAt is when the oldest counted renewal that keeps the node at
	// its limit leaves the window: the earliest time a renewal may pass.
	RetryAt time.Time
}

func (e *RenewalLimitError) Error() string {
	return fmt.Sprintf("node %s renewed %d times in %s (limit %d): the next renewal may come at %s",
		e.NodeID, e.Count, e.Limit.Window, e.Limit.Max, e.RetryAt.UTC().Format(time.RFC3339Nano))
}

// OverRenewalLimit returns the refusal of a renewal at now of a node whose
// renewals issued at or after now - limit.Window are times (oldest first),
// or nil when one more fits. The stores and the service's early check
// count alike with it.
func OverRenewalLimit(nodeID string, times []time.Time, limit RenewalLimit) *RenewalLimitError {
	if len(times) < limit.Max {
		return nil
	}
	return &RenewalLimitError{
		NodeID:  nodeID,
		Count:   len(times),
		Limit:   limit,
		RetryAt: times[len(times)-limit.Max].Add(limit.Window),
	}
}
