// Package store defines the control plane's persistent state behind one
// interface and one conformance suite (package storetest), so that more
// than one implementation can stand behind it: the embedded SQLite store
// (package sqlite), and the PostgreSQL store (package postgres) that
// several fleetd replicas share. Both pass the same suite unchanged.
//
// Implementations return the sentinel errors of this package; they never
// return RPC status codes. The server maps them to wire codes in one place.
package store
