// Package actuator asks the systems that run workloads to act on a node
// fleetd no longer trusts (seed 003, "Runtime identity and withdrawal"):
// when a worker fails an authenticated boot check, fleetd quarantines it
// and requests a cordon through an [Actuator]. A cordon stops new
// scheduling; it does not stop running workloads or isolate the network.
//
// [Webhook] posts the request as JSON to a configured URL (fleetd.toml
// [actuator], docs/boot-policy.md); a Kubernetes actuator comes with the
// Kubernetes issue. The package is fleetd's; it does not log: the caller
// logs and counts what a request returns.
package actuator
