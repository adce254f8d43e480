// Package lifecycle holds the fleet lifecycle of seed 003: the states
// (planned → provisioning → active, quarantined, retired, and revoked after
// a plain revocation), which transitions exist and which admin action each
// needs, the table of what a machine in each state may do
// (docs/lifecycle.md), and the admission rules a join passes before the
// service issues anything: declarations, EK bindings by authority,
// provisioning, quarantine and retirement.
//
// The service (internal/fleetd/service) calls Admission for every join and
// Manager for every lifecycle action; other fleetd packages (boot policy's
// quarantine after a failed boot check) call Manager.Quarantine and
// Manager.Release with their actor and reason. Retirement runs the
// RetireHooks the wiring registers (the SPIRE export, Kubernetes).
package lifecycle
