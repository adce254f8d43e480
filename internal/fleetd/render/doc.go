// Package render turns a declared machine into the config its installer
// writes (docs/install.md, "Rendering"): one Renderer per machine class
// behind one interface, a Registry that picks the class's renderer, and the
// plain text/template renderer for classes that are not Talos (package
// render/talos renders Talos machine configs).
//
// A render needs the node's declared facts, a per-node join credential the
// caller made, and the control plane's address and pins. Render refuses a
// declaration that lacks a field the config needs with a *FieldError naming
// the field, so the caller refuses the provision before any install code is
// issued. No error of this package carries the join credential: it is a
// secret, and errors reach logs.
//
// Only render/talos imports the Talos machinery library; this package and
// its callers stay free of it (package render/renderers builds a Registry
// from fleetd.toml and is imported by fleetd's wiring only).
package render
