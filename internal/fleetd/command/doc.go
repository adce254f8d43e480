// Package command is the fleetd command line: init, serve, dev, and the
// admin commands (token, nodes) that talk to a running server.
package command
