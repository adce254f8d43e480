// Package talos renders Talos machine configs with Talos's own machinery
// library (github.com/siderolabs/talos/pkg/machinery at v1.11.5): a
// worker's or a control plane's config by the node's role, named after
// the node, installing to its declared disk, for the class's cluster and
// secrets bundle, and carrying the node's bcd configuration and join
// credential as machine files (docs/install.md, "Rendering"). Each render
// is checked with machinery's own validation in metal mode before it is
// returned, so a config Talos would refuse is never released.
//
// This is the one package that imports the machinery library; package
// render/renderers, which fleetd's wiring calls, is the one that imports
// this package.
package talos
