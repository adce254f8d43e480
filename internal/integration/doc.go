// Package integration runs the real fleetd and bcd binaries on loopback,
// end to end. The binaries are built once per test run.
package integration
