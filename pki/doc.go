// Package pki holds nodetrust's certificate authority and the cryptography
// of the join protocol: pins, key and certificate files, node certificate
// issuance, HPKE-sealed join tokens, renewal proofs of possession, and the
// files `fleetd init` writes. The signed join response, which needs the wire
// types, is in package pki/joinresponse.
//
// Keys are passed as [crypto.Signer], so a key may live in a file, a TPM or
// a PKCS#11 token; this package never stores anything except in [Init].
// It does no logging and no I/O beyond the files its Read and Init
// functions name. It imports the standard library only — no wire types, no
// storage, no HTTP, no logging — so that `bcd`, `fleetd` and other programs
// can all use it (internal/repotest's dependency table enforces this).
//
// The formats produced here (pins, PEM types, JWKs, signature labels and the
// HPKE info string) are part of the wire contract in DESIGN.md §2: they
// change only with a new version label.
package pki
