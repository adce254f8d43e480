// Package leases keeps the exclusive leases on a node's resources, such as
// its GPUs, that the daemon's leases service grants.
//
// A client acquires a resource with a goal: the goal is granted at once
// when the resource is free, else it waits, first come first served, until
// the holder releases the lease, cancels its goal, or lets the lease
// expire. A granted lease lasts its time to live unless renewed. Only the
// sender of a goal may renew, release or cancel it: a goal id travels on
// the wire, so without this check any client could end another's goal.
//
// Senders are the principals the daemon proved (package localapi's
// Principal); this package trusts them as given. It keeps everything in
// memory, is safe for concurrent use, takes its clock from its caller, and
// does no logging. Only the daemon (package daemon) imports it.
package leases
