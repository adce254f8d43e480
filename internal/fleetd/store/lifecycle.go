package store

import "time"

// AdminCred is an admin client certificate fleetd issued or first saw:
// its name and role are in the certificate; the record says whether it was
// revoked.
type AdminCred struct {
	// Serial is the certificate's serial, lower-case hex.
	Serial    string
	Name      string
	Role      string
	CreatedBy string
	CreatedAt time.Time
	NotAfter  time.Time
	// RevokedAt is zero while the credential is not revoked.
	RevokedAt time.Time
	RevokedBy string
}

// Declaration is one machine of the declared inventory (docs/inventory.md):
// what a declarer says the machine is. Its Name is the node id the machine
// gets. These are declarations, not proof: only the EK binding, when a
// declarer wrote it, authorizes anything.
type Declaration struct {
	Name        string
	Serial      string
	ProductUUID string
	MACs        []string
	Class       string
	Site        string
	Role        string
	// SwitchChassis and SwitchPort are the expected switch port.
	SwitchChassis string
	SwitchPort    string
	// InstallDisk is the device the installer writes the system to
	// ("/dev/sda", "/dev/disk/by-id/…"); a render needs it.
	InstallDisk string
	// EKPins is the EK binding: the pins of the EKs this machine may prove.
	EKPins []string
	// EKSource is where the binding came from ("receiving-scan",
	// "supplier-record"), EKReference a free-text pointer to it.
	EKSource    string
	EKReference string
	// Version counts the writes of this declaration (1 after the first).
	Version   uint64
	UpdatedAt time.Time
}

// DeclarationWrite is one declaration to write and the version it replaces
// (0 for a new one).
type DeclarationWrite struct {
	Declaration Declaration
	PrevVersion uint64
}

// FieldChange is one entry of the inventory's changelog: who wrote which
// field of which device, when, and from which request.
type FieldChange struct {
	Time   time.Time
	Device string
	Field  string
	// Old and New are the field's text before and after ("" when unset).
	Old, New string
	// Actor is the admin credential's name, ActorRole its role when it
	// wrote.
	Actor     string
	ActorRole string
	RequestID string
	// Source is "inventory" (fleetd inventory apply) or another source's
	// name.
	Source string
}

// InventoryWrite is everything one inventory apply writes, atomically.
type InventoryWrite struct {
	Writes  []DeclarationWrite
	Changes []FieldChange
	Audit   *AuditEvent
}

// StateChange is one entry of a node's lifecycle history.
type StateChange struct {
	Time   time.Time
	NodeID string
	// From is the state before ("" for a node that did not exist, which a
	// declared device's first change names as planned).
	From, To  string
	Actor     string
	Reason    string
	RequestID string
}

// Transition is a change of one node's state (see Store.TransitionNode).
type Transition struct {
	NodeID string
	// From are the states the node may be in.
	From []string
	To   string
	// Create, when set, is the node to write when there is none.
	Create *Node
	// Revoke raises the generation and revokes the node's certificates.
	Revoke    bool
	Time      time.Time
	Actor     string
	Reason    string
	RequestID string
	Audit     *AuditEvent
}

// Claim is a machine that asked to join and was not admitted: what it
// claimed, capped, and how often. A claim authorizes nothing.
type Claim struct {
	// Key identifies the machine: its proven EK pin, else its product
	// UUID or first serial, else its hostname.
	Key         string
	Attestor    string
	EKPin       string
	ProductUUID string
	Serials     []string
	MACs        []string
	Hostname    string
	Peer        string
	// Reason says why it was not admitted; Declared names the declaration
	// its claims matched, if any.
	Reason    string
	Declared  string
	FirstSeen time.Time
	LastSeen  time.Time
	Count     uint64
}
