//go:build !unix

package fleetd

// openFileLimit is unknown on this system: no connection limit is lowered.
func openFileLimit() uint64 { return 0 }
