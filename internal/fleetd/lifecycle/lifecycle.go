package lifecycle

import (
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Machine classes. Boot policy is chosen per class; more classes can be
// configured ([inventory] classes in fleetd.toml).
const (
	ClassWorker             = "worker"
	ClassControlPlane       = "control-plane"
	ClassInstallEnvironment = "install-environment"
)

// DefaultClasses are the classes a declaration may name when fleetd.toml
// names none.
var DefaultClasses = []string{ClassWorker, ClassControlPlane, ClassInstallEnvironment}

// Capability is something a machine may ask of the control plane.
type Capability string

// The capabilities docs/lifecycle.md's table has a column for.
const (
	Renew     Capability = "renew"
	Session   Capability = "session"
	TokenJoin Capability = "token join"
	TPMJoin   Capability = "tpm join"
)

// Rule is one row of docs/lifecycle.md's table: what a machine in a state
// may do and how it comes back.
type Rule struct {
	State string
	// May says whether each capability is allowed at all; the join
	// columns' conditions are Admission's.
	May map[Capability]bool
	// Join says on what terms a join is taken.
	Join string
	// Back says how a machine in this state comes back to active.
	Back string
}

// Table is the one table of what each state may do; the service enforces
// it (Renew and Session in the store and the node authentication, the
// joins in Admission) and docs/lifecycle.md prints it.
var Table = []Rule{
	{store.StatePlanned, map[Capability]bool{TokenJoin: true, TPMJoin: true},
		"token: the token authorizes the first installation; tpm: only an EK its declarer-written binding names, once provisioned (or auto-provisioned as a worker)",
		"provisioned, then joined"},
	{store.StateProvisioning, map[Capability]bool{TokenJoin: true, TPMJoin: true},
		"as planned (no certificate yet), without waiting for an authorization: it has one",
		"its join makes it active"},
	{store.StateActive, map[Capability]bool{Renew: true, Session: true, TokenJoin: true, TPMJoin: true},
		"token: only with --allow-reclaim, and never for a node held to an EK; tpm: only the EK fleetd proved for it",
		"-"},
	{store.StateRevoked, map[Capability]bool{TokenJoin: true, TPMJoin: true},
		"fresh evidence only: a token made with --allow-reclaim (a node without a proven EK), or its TPM — the same EK, fresh attestation — after bcd join --reset",
		"a re-join with fresh evidence"},
	{store.StateQuarantined, map[Capability]bool{Session: true},
		"none, by token or TPM, until fleetd nodes release",
		"fleetd nodes release"},
	{store.StateRetired, map[Capability]bool{},
		"none, ever",
		"declared again under a new name (a new inventory entry, planned)"},
}

// May reports whether a node in state may do c at all.
func May(state string, c Capability) bool {
	for _, r := range Table {
		if r.State == state {
			return r.May[c]
		}
	}
	return false
}

// Transition is one lifecycle action: the states it leaves, the one it
// reaches and the admin action it needs.
type Transition struct {
	Name   string
	From   []string
	To     string
	Action roles.Action
	// Revoke revokes the node's certificates (and raises its generation).
	Revoke bool
}

// The lifecycle actions (fleetd nodes provision|quarantine|release|retire).
var (
	Provision  = Transition{"provision", []string{store.StatePlanned}, store.StateProvisioning, roles.Lifecycle, false}
	Quarantine = Transition{"quarantine", []string{store.StateActive, store.StateProvisioning}, store.StateQuarantined, roles.Lifecycle, false}
	Release    = Transition{"release", []string{store.StateQuarantined}, store.StateActive, roles.Release, false}
	Retire     = Transition{"retire", []string{store.StatePlanned, store.StateProvisioning, store.StateActive, store.StateRevoked, store.StateQuarantined},
		store.StateRetired, roles.Retire, true}
)

// Transitions lists the lifecycle actions.
var Transitions = []Transition{Provision, Quarantine, Release, Retire}

// MarkdownRow renders a rule as its row of docs/lifecycle.md's table.
func MarkdownRow(r Rule) string {
	yes := func(c Capability) string {
		if r.May[c] {
			return "yes"
		}
		return "no"
	}
	return "| `" + r.State + "` | " + yes(Renew) + " | " + yes(Session) + " | " + yes(TokenJoin) + " | " + yes(TPMJoin) + " | " + r.Join + " | " + r.Back + " |"
}
