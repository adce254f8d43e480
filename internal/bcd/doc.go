// Package bcd wires the node program's long-running parts, the way package
// fleetd wires the control plane. [RunNode] opens the TPM and the journal
// once, loads the identity once, and runs the agent (the live session and
// its renewals), the local API and the federation listener together, all
// sharing that one identity. [RunHelper] runs bcd helper, the root process
// that owns the TPM. [OpenTPM] opens the TPM config.toml names, directly or
// through bcd helper.
//
// The command layer (internal/bcd/command) parses flags and calls these;
// only it imports this package, which may import every package under
// internal/bcd.
package bcd
