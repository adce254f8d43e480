// Package store defines the control plane's persistent state behind one
// interface, so the embedded SQLite store and the PostgreSQL store are
// interchangeable and pass one conformance suite (package storetest).
//
// Implementations return the sentinel errors of this package; they never
// return RPC status codes. The server maps them to wire codes in one place.
package store
