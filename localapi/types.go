package localapi

import "time"

// The payloads of the daemon's services, as JSON. docs/local-api.md lists
// them with examples. A request with a field the daemon does not know is
// refused, so a misspelt field is an error rather than silently ignored.

// Principal is a sender as the daemon proved it: the sender id and the
// node of the daemon it belongs to.
type Principal struct {
	NodeID string `json:"node_id"`
	Sender string `json:"sender"`
}

// String returns "sender@node".
func (p Principal) String() string { return p.Sender + "@" + p.NodeID }

// Status is the reply of status/get.
type Status struct {
	NodeID      string `json:"node_id"`
	Namespace   string `json:"namespace"`
	TrustDomain string `json:"trust_domain"`
	BootID      string `json:"boot_id"`
	Version     string `json:"version,omitempty"`
	// Caller is the sender the call proved.
	Caller Principal `json:"caller"`
	// MachineCertificate is the node certificate that proves this
	// machine's calls to other machines; nil when the daemon has none.
	MachineCertificate *Certificate `json:"machine_certificate"`
	// FederationAddress is where the daemon takes calls of other
	// machines; empty when it takes none.
	FederationAddress string `json:"federation_address,omitempty"`
	// Instances is the number of running instances.
	Instances int `json:"instances"`
	// Resources are the resources the leases service leases.
	Resources []string `json:"resources"`
	// Launch is the name of the active launch, if any.
	Launch string `json:"launch,omitempty"`
	// ReplayEntries is the number of nonces the replay cache holds.
	ReplayEntries int `json:"replay_entries"`
}

// Certificate describes the machine certificate.
type Certificate struct {
	Serial   string    `json:"serial"`
	NotAfter time.Time `json:"not_after"`
}

// AcquireRequest is the payload of leases/acquire: a goal to hold Resource
// exclusively for TTLSeconds (default 60, at most 3600) once it is free.
type AcquireRequest struct {
	Resource   string `json:"resource"`
	TTLSeconds int    `json:"ttl_seconds,omitempty"`
}

// RenewRequest is the payload of leases/renew: extend the granted lease of
// goal GoalID to TTLSeconds from now.
type RenewRequest struct {
	GoalID     string `json:"goal_id"`
	TTLSeconds int    `json:"ttl_seconds,omitempty"`
}

// GoalRequest is the payload of leases/release and of the cancel (kind
// "cancel") of a leases/acquire goal.
type GoalRequest struct {
	GoalID string `json:"goal_id"`
}

// The states of a lease goal.
const (
	GoalWaiting   = "waiting"   // queued behind the holder of the resource
	GoalGranted   = "granted"   // holds the lease until ExpiresAt
	GoalReleased  = "released"  // released by its sender
	GoalCancelled = "cancelled" // cancelled by its sender, or ended with its instance
	GoalExpired   = "expired"   // not renewed in time
)

// Goal is a lease goal: the reply of leases/acquire, renew, release and
// cancel.
type Goal struct {
	GoalID   string    `json:"goal_id"`
	Resource string    `json:"resource"`
	Sender   Principal `json:"sender"`
	State    string    `json:"state"`
	// ExpiresAt is when a granted lease ends unless renewed.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// Leases is the reply of leases/list.
type Leases struct {
	Resources []ResourceLeases `json:"resources"`
}

// ResourceLeases is one resource: its holder, if any, and the goals
// waiting for it, first in line first.
type ResourceLeases struct {
	Resource string `json:"resource"`
	Holder   *Goal  `json:"holder,omitempty"`
	Waiting  []Goal `json:"waiting"`
}

// Membership is the reply of membership/list: the machines and instances
// the daemon knows.
type Membership struct {
	Machines  []Machine  `json:"machines"`
	Instances []Instance `json:"instances"`
}

// Machine is a machine the daemon knows: itself, one the active launch or
// config.toml names, or one whose call it took.
type Machine struct {
	NodeID  string `json:"node_id"`
	Self    bool   `json:"self,omitempty"`
	Address string `json:"address,omitempty"`
	// BootID is the boot of the machine's daemon, when known.
	BootID string `json:"boot_id,omitempty"`
	// Sources say how the daemon knows the machine: "self", "launch",
	// "config" and "call".
	Sources []string `json:"sources"`
	// LastCall is when the daemon last took a call of the machine.
	LastCall *time.Time `json:"last_call,omitempty"`
}

// The states of an instance in Membership.
const (
	InstanceRunning = "running" // started on this machine by bcd run
	InstancePlaced  = "placed"  // placed on another machine by the active launch
)

// Instance is an instance the daemon knows.
type Instance struct {
	Name   string `json:"name"`
	NodeID string `json:"node_id"`
	State  string `json:"state"`
	// PID and StartedAt are set for a running instance of this machine.
	PID       int        `json:"pid,omitempty"`
	StartedAt *time.Time `json:"started_at,omitempty"`
}

// StartRequest is the payload of instances/start, the first message of
// the Run stream.
type StartRequest struct {
	// Name is the instance's name and sender id; empty lets the daemon
	// make one.
	Name string `json:"name,omitempty"`
	// Command is the program's name, for the made name and for logs.
	Command string `json:"command,omitempty"`
}
