// Package tinkerbell writes the Tinkerbell objects of an admitted
// provision (seed 003, "Installation and config release"; docs/install.md,
// "Tinkerbell"): the machine's Hardware (its MACs, install disk and product
// UUID from the declaration), a Template whose one action runs the
// provision script internal/fleetd/provision renders (with its two gates:
// this boot's pass marker and the install code), and the Workflow that
// joins them. Each object is created, or updated when it exists, in one
// namespace, with client-go's dynamic client (tink's Go types are not
// imported). A Workflow that has finished is replaced so that it runs
// again.
//
// [Provisioner.Apply] writes the objects only; the Install RPC calls it
// while the machine is in the install environment, where tink's agent runs
// the Workflow in the same boot. [Provisioner.Start] writes them and then
// sets the machine's next boot to PXE and power-cycles it through a
// [bmc.Controller], for a machine that is not in the install environment.
//
// The package does not log; its errors name the object and never hold a
// secret (the objects hold none: the install code reaches the machine
// wrapped to its TPM, never through Tinkerbell).
package tinkerbell
