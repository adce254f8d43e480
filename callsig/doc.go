// Package callsig signs and verifies the calls that clients make to a
// nodetrust node daemon (`bcd node`), and the machine proofs that carry
// trust between the daemons of a federation.
//
// Each client signs each call with an Ed25519 key: an instance with a key
// made for each start, the command line with its key file, a daemon with a
// key made at each boot. A [Signer] turns a call (namespace, key expression,
// kind, payload) into an [Envelope] with a fresh timestamp and nonce; the
// envelope travels as the bytes of [Envelope.MarshalBinary]. A daemon
// decodes it with [Envelope.UnmarshalBinary] and checks it with
// [Verifier.Verify], which refuses with a [*Rejection] naming the check that
// failed: no signature, malformed, unknown sender, bad signature, namespace,
// timestamp (more than [Window] from the daemon's clock), replay (a nonce
// already seen) or a full replay cache. A probe, which only tells a client
// that a service is there, needs no signature (see [IsProbe]).
//
// Across machines, a daemon proves its clients with its node certificate:
// at each boot it signs a [BootStatement] naming its boot key with the node
// key, and endorses each client key with an [Endorsement] signed by the boot
// key. A call to another machine carries a [MachineProof];
// [VerifyMachineProof] checks it against the receiver's [TrustBundle] and
// returns the [Peer] it proves, and [Verifier.VerifyPeer] checks the call
// itself under the endorsed key.
//
// The byte formats (what is signed, and the wire encodings) are written down
// in docs/callsig.md, with a worked example, so that a client in another
// language can be written from that document alone. They are part of
// nodetrust's wire contract: they change only with a new version label.
//
// This package is a public library: other programs may import it, and its
// exported API is stable. It depends only on the standard library and the
// pki package, keeps no files and does no logging; every failure is a
// returned error.
package callsig
