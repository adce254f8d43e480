// Package fleetd wires the control plane together: it loads the PKI,
// opens the store, builds the server and serves it until its context ends.
// It is the only package besides the command-line packages that may
// import everything.
package fleetd
