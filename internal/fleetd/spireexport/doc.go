// Package spireexport applies the registration export (package export)
// to a SPIRE server through its server API on the admin Unix socket
// (docs/spire.md): it creates and updates the fleet-owned registration
// entries (marked with the entry hint "nodetrust"), deletes the
// fleet-owned entries of nodes that left the export, bans the agents of
// withdrawn nodes unless another registration still carries them, and
// bans the agents of explicitly retired nodes on sight. Entries it did not
// create are never changed.
//
// The safeguards come first: an empty device list, a malformed or
// unverifiable export, and a change that withdraws or bans more nodes
// than the threshold (until the owner allows its digest) change nothing.
// Plan and its helpers are pure (the table tests); Applier does the I/O,
// paging through ListEntries and ListAgents so memory stays bounded by the
// page size and the fleet, not by the server's entries.
package spireexport
