// Package joinresponse signs and opens the JoinService's signed join result
// (DESIGN.md §2): fleetd signs each JoinResult with its JoinService key, and
// a node opens it only under its join_signing_key_pin and only for its own
// CSR. It is the one part of the join protocol's cryptography that needs the
// wire types (api/joinv1, and so protobuf and gRPC); it lives apart from
// package pki so that pki and the libraries built on it stay free of them.
//
// It does no logging and no I/O. The signature label and encoding are part of
// the wire contract: they change only with a new version label.
package joinresponse
