// Package console is fleetd's web console: server-rendered pages of the
// fleet, a node, pending approvals and claims, the audit trail and live
// figures, and the lifecycle actions behind confirmations. It speaks to
// the control plane only through the Admin API with the credential it is
// given (as `kubectl proxy` does), so every action is checked by the
// API's own role rules. It is served on loopback to one browser that logs
// in with a one-time code; every asset is embedded in the binary,
// nothing is fetched from elsewhere and no script runs.
//
// It is fleetd's own (imported by internal/fleetd/command) and has no
// stability promise.
package console
