// Package launch reads a launch file, which places named instances on the
// machines of a federation by node id, and makes the placement check of the
// launch coordinator: a daemon takes a call of an instance of another
// machine as that instance only when the launch places the instance on that
// machine.
//
// A launch file is TOML (docs/local-api.md):
//
//	name = "demo"
//
//	[machines.node-a]
//	address = "10.0.0.1:7443"   # the federation address of its daemon
//
//	[machines.node-b]
//	address = "10.0.0.2:7443"
//
//	[instances.trainer]
//	node = "node-b"
//
// bcd launch FILE parses it and hands it to the daemon of its machine
// (service launch, method apply), which validates it again. This package
// does no I/O and no logging; it is imported by the command line and the
// daemon.
package launch
