// Package tpmpub parses and checks TPM 2.0 public areas (TPMT_PUBLIC, TPM 2.0
// Part 2, section 12.2.4), computes TPM names (Part 1, section 16), extracts
// EK public keys, and verifies the AK's signed attestations (TPMS_ATTEST and
// TPMT_SIGNATURE), from bytes alone: it never talks to a TPM.
//
// It holds the one definition of the keys nodetrust derives — the node key and
// the attestation key (AK), ECDSA P-256 signing keys under the owner hierarchy
// — so that the node (package tpm, which derives them) and the verifier
// (package attest, which checks what a node claims) cannot drift apart.
//
// Every function takes untrusted bytes: a public area is parsed strictly (the
// bytes must be exactly the marshalling of what they decode to) and a panic in
// go-tpm's unmarshalling is turned into an error.
//
// Importers: package tpm, package attest and package tpmhelper. The API is internal to nodetrust
// and may change.
package tpmpub
