// Package inventory is fleetd's declared inventory (docs/inventory.md):
// the nodes.yaml schema and its parser, which lists every error by line;
// the plan an apply makes (field by field, with the changelog entry of
// each field: who wrote it, when, from which request); and the Source
// interface admission reads declarations and EK-binding authority from —
// the store (StoreSource) or NetBox (package inventory/netbox).
//
// The service (internal/fleetd/service) and the lifecycle rules
// (internal/fleetd/lifecycle) import it; it never writes the store itself:
// the service writes a Plan's Writes and Changes in one transaction.
package inventory
