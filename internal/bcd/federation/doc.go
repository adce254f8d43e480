// Package federation holds what a node daemon proves itself with to the
// daemons of other machines, and what it trusts them by: its machine
// credentials.
//
// The node certificate is the machine certificate. At each boot a
// [Machine] makes a boot key (Ed25519, kept in memory) and signs a boot
// statement naming it with the node key; with the boot key it endorses the
// key of the command line and of each instance the daemon starts. For a
// call of one of its clients to another machine it builds the machine
// proof (chain, statement, endorsement) that package callsig defines, and
// it gives the trust bundle (the roots and trust domain of its identity)
// against which the daemon checks the proofs of other machines. It also
// gives the TLS configurations of the federation listener (the node
// certificate as server certificate) and of calls to another machine's
// daemon (whose certificate must be the node certificate of the node
// called).
//
// When bcd node renews the certificate, the Machine reads the new one from
// the data directory (identity.json and node.key, read only: it never
// repairs files, which the agent owns) and signs a new statement.
//
// Only the daemon (package daemon) imports this package. It does no
// logging; every failure is a returned error.
package federation
