package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
)

// RetireHook is told of every retirement after it is stored: the SPIRE
// export withdraws the node, the Kubernetes actuator removes it. A hook's
// error does not undo the retirement; it is reported to the caller (and
// the hook retries on its own schedule).
type RetireHook interface {
	// Name names the hook in messages.
	Name() string
	Retired(ctx context.Context, n store.Node, reason string) error
}

// ReleaseHook is told of every release of a quarantine after it is
// stored: the Kubernetes actuator uncordons the node. Its error does not
// undo the release; it is reported to the caller.
type ReleaseHook interface {
	// Name names the hook in messages.
	Name() string
	Released(ctx context.Context, n store.Node, reason string) error
}

// Manager carries out lifecycle actions: each is one store transaction
// that checks the state it leaves, writes the new one, appends the node's
// history and the audit trail.
type Manager struct {
	Store  store.Store
	Source inventory.Source
	// TrustDomain names the SPIFFE ID of a node record a planned device
	// gets when it is provisioned or retired.
	TrustDomain string
	Hooks       []RetireHook
	// ReleaseHooks run after each release.
	ReleaseHooks []ReleaseHook
	// Revoked, when set, is told of a retirement's revocation so live
	// sessions end (the service's session registry); it reports whether
	// a live session was told.
	Revoked func(nodeID, reason string, generation uint64) bool
	Now     func() time.Time
}

// Result is what a lifecycle action did.
type Result struct {
	Node    store.Node
	Revoked []string
	// HookErrors are the retirement or release hooks that failed.
	HookErrors []error
	// SessionNotified says a live session was ended by the revocation.
	SessionNotified bool
	// TokensDeleted and PendingDeleted count the join credentials a
	// retirement removed (unused tokens made for the node, its pending
	// joins).
	TokensDeleted, PendingDeleted int
}

// StateError is an action refused because of the node's state.
type StateError struct {
	NodeID string
	State  string
	Action Transition
}

func (e *StateError) Error() string {
	return fmt.Sprintf("node %s is %s: %s needs state %s", e.NodeID, e.State, e.Action.Name, strings.Join(e.Action.From, " or "))
}

// ErrUnknown is an action on a name that is neither a node nor declared.
var ErrUnknown = errors.New("no such node or declared device")

// ErrReason is a missing or malformed reason: errors.Is finds it in what
// CheckReason returns, whose message says which.
var ErrReason = errors.New("a reason is required (--reason): one line of at most 256 bytes")

type reasonError string

func (e reasonError) Error() string        { return string(e) }
func (e reasonError) Is(target error) bool { return target == ErrReason }

// CheckReason checks an operator's reason: required, one line, bounded.
func CheckReason(r string) (string, error) {
	r = strings.TrimSpace(r)
	switch {
	case r == "":
		return "", reasonError("a reason is required (--reason)")
	case len(r) > 256 || strings.ContainsAny(r, "\n\r"):
		return "", reasonError("the reason must be one line of at most 256 bytes")
	}
	return r, nil
}

// Quarantine moves an active or provisioning node to quarantined: it
// keeps its certificate and session but renews and re-joins nothing until
// Release. actor names who decided ("admin:<name>", "bootpolicy").
func (m *Manager) Quarantine(ctx context.Context, nodeID, actor, reason, requestID string) (Result, error) {
	return m.Do(ctx, Quarantine, nodeID, actor, reason, requestID)
}

// Release lifts a quarantine: the node is active again and renews.
func (m *Manager) Release(ctx context.Context, nodeID, actor, reason, requestID string) (Result, error) {
	return m.Do(ctx, Release, nodeID, actor, reason, requestID)
}

// Provision authorizes a planned device's first installation: its join
// is then taken (a TPM join still needs its declarer-written binding).
func (m *Manager) Provision(ctx context.Context, nodeID, actor, reason, requestID string) (Result, error) {
	return m.Do(ctx, Provision, nodeID, actor, reason, requestID)
}

// Retire retires a node for good: its certificates are revoked, its live
// session ends, it never renews or re-joins again, and the retirement
// hooks run.
func (m *Manager) Retire(ctx context.Context, nodeID, actor, reason, requestID string) (Result, error) {
	return m.Do(ctx, Retire, nodeID, actor, reason, requestID)
}

// Do carries out t on nodeID. A declared device without a node record is
// planned: provisioning or retiring it writes its record.
func (m *Manager) Do(ctx context.Context, t Transition, nodeID, actor, reason, requestID string) (Result, error) {
	reason, err := CheckReason(reason)
	if err != nil {
		return Result{}, err
	}
	now := time.Now()
	if m.Now != nil {
		now = m.Now()
	}
	tr := store.Transition{NodeID: nodeID, From: t.From, To: t.To, Revoke: t.Revoke, Time: now, Actor: actor, Reason: reason, RequestID: requestID,
		Audit: &store.AuditEvent{Time: now, Actor: actor, Action: "node." + t.Name, Subject: nodeID, Detail: reason}}
	if _, err := m.Store.GetNode(ctx, nodeID); errors.Is(err, store.ErrNotFound) {
		create, err := m.plannedRecord(ctx, nodeID)
		if err != nil {
			return Result{}, err
		}
		tr.Create = create
	} else if err != nil {
		return Result{}, fmt.Errorf("look up node %s: %w", nodeID, err)
	}
	n, serials, err := m.Store.TransitionNode(ctx, tr)
	switch {
	case errors.Is(err, store.ErrConflict):
		cur, gerr := m.Store.GetNode(ctx, nodeID)
		if gerr != nil {
			return Result{}, fmt.Errorf("%s node %s: %w", t.Name, nodeID, err)
		}
		return Result{}, &StateError{NodeID: nodeID, State: cur.State, Action: t}
	case errors.Is(err, store.ErrNotFound):
		return Result{}, fmt.Errorf("%s %s: %w", t.Name, nodeID, ErrUnknown)
	case err != nil:
		return Result{}, fmt.Errorf("%s node %s: %w", t.Name, nodeID, err)
	}
	res := Result{Node: n, Revoked: serials}
	if t.Revoke && m.Revoked != nil {
		res.SessionNotified = m.Revoked(nodeID, reason, n.Generation)
	}
	if t.Name == Release.Name {
		for _, h := range m.ReleaseHooks {
			if err := h.Released(ctx, n, reason); err != nil {
				res.HookErrors = append(res.HookErrors, fmt.Errorf("release hook %s: %w", h.Name(), err))
			}
		}
	}
	if t.To == store.StateRetired {
		// Nothing could start a join of a retired node (admission refuses
		// it), but its unused tokens and pending joins go too, so no
		// credential for it is left to leak or approve.
		tokens, pending, err := m.Store.DeleteJoinCredentials(ctx, nodeID, nil)
		if err != nil {
			res.HookErrors = append(res.HookErrors, fmt.Errorf("delete the join credentials of %s: %w", nodeID, err))
		} else {
			res.TokensDeleted, res.PendingDeleted = tokens, pending
			if tokens+pending > 0 {
				_ = m.Store.AppendAudit(ctx, store.AuditEvent{Time: now, Actor: actor, Action: "node.join-credentials.delete", Subject: nodeID,
					Detail: fmt.Sprintf("retired: %d unused join tokens and %d pending joins removed", tokens, pending)})
			}
		}
		for _, h := range m.Hooks {
			if err := h.Retired(ctx, n, reason); err != nil {
				res.HookErrors = append(res.HookErrors, fmt.Errorf("retirement hook %s: %w", h.Name(), err))
			}
		}
	}
	return res, nil
}

// plannedRecord is the node record of a declared device that has none.
func (m *Manager) plannedRecord(ctx context.Context, id string) (*store.Node, error) {
	d, err := m.Source.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%s: %w", id, ErrUnknown)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSourceUnavailable, err)
	}
	gen, err := m.Store.NextGeneration(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("next generation of %s: %w", id, err)
	}
	return &store.Node{ID: id, SPIFFEID: pki.NodeSPIFFEID(m.TrustDomain, id), Role: DeclaredRole(d), Site: d.Site,
		Class: d.Class, State: store.StatePlanned, Generation: gen}, nil
}
