// Package localapi is the Go client library of a node daemon's local API
// (`bcd node`): a program signs each call to the daemon of its machine with
// package callsig and reads the reply.
//
// A program started by `bcd run` needs nothing but this package: [FromEnv]
// reads the runtime configuration that the environment variable
// NODETRUST_RUNTIME names, loads the key file of this start, and dials the
// daemon's unix socket. The command line signs with the key in
// credentials/command_line.key of the data root ([ReadKeyFile]).
//
// The package also holds what clients and the daemon share: the layout of
// the key expressions of calls ([KeyExpr]), the runtime configuration
// ([Runtime]), the key file format, the payload types of the daemon's
// services, and a client of the federation service that daemons serve to
// each other ([DialFederation]). docs/local-api.md describes all of it, so
// that a client in another language can be written from that document.
//
// This package is a public library: other programs may import it, and its
// exported API is stable. It keeps no files and does no logging.
package localapi
