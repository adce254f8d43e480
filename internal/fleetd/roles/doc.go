// Package roles is fleetd's table of admin roles and what each may do:
// owner (everything), declarer (the inventory and its EK bindings, nothing
// else), operator (lifecycle actions but retirement, tokens, reading the
// fleet) and auditor (reading only). The service checks every admin call
// against it (internal/fleetd/service), and the CLI names roles by it.
package roles
