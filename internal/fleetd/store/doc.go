// Package store defines the control plane's persistent state behind one
// interface and one conformance suite (package storetest), so that more
// than one implementation can stand behind it. Today there is one: the
// embedded SQLite store (package sqlite). A PostgreSQL store, for several
// fleetd replicas, is to join it and must pass the same suite unchanged.
//
// Implementations return the sentinel errors of this package; they never
// return RPC status codes. The server maps them to wire codes in one place.
package store
