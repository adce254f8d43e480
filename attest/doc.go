// Package attest is the control plane's verifier of TPM evidence: it decides,
// from bytes alone, whether what a node sent proves what it claims. It never
// opens a TPM, stores nothing, does no network I/O and does not log; it
// returns errors that wrap one documented sentinel per check
// ([ErrUntrustedEK], [ErrActivation], [ErrQuote], [ErrEventLog],
// [ErrCertify], and [ErrAK] for an unacceptable attestation key).
//
// A tpm join runs these checks, in this order (seed 003, "Attestation and
// admission"):
//
//  1. The EK. [Verifier.VerifyEKCertificate] checks the EK certificate the
//     node read from its TPM's NV against the TPM manufacturers' roots, or the
//     caller compares [EKPin] with a pin it already holds for the node. Both
//     take the EK's public key from [EKPublic] of the very EK public area the
//     challenge is made for.
//  2. Credential activation. [NewChallenge] seals a fresh secret to the EK
//     and to the AK's name, which it computes from the AK's public area
//     itself (TPM 2.0 Part 1, section 24 "Credential Protection"). Only the
//     TPM that holds the EK releases it, and only to an object of that name
//     loaded in the same TPM, so [Challenge.Check] of the node's answer
//     proves that the AK sits in the EK's TPM.
//  3. The quote. [VerifyQuote] checks that the AK signed a quote of the
//     SHA-256 PCRs 0–7 over the verifier's fresh nonce, and that the PCR
//     values the node reported are the quoted ones.
//  4. The event log. [ReplayEventLog] replays the node's measurement log
//     against the quoted PCR values (a quoted PCR without events must hold
//     its initial value) and summarises its Secure Boot state;
//     [EventLog.BootState] reads what the replayed log says of the boot:
//     Secure Boot and its databases, the authorities that verified each
//     boot application, and the code measured into PCR 4.
//  5. The node key. [VerifyCertify] checks the AK's TPM2_Certify of the node
//     key over sha256(csr) and returns the key, for the caller to compare
//     with the CSR's.
//
// Every input is untrusted and parsed strictly; a malformed input is an
// error, never a panic. Every function depends on its arguments alone (and
// on [Config] for the [Verifier], and on randomness for [NewChallenge]) and
// is safe for concurrent use. Policy —
// which PCR values, Secure Boot state or signing authorities are acceptable,
// which EK a node may use, nonce and challenge lifetimes — is the caller's.
//
// The AK is a primary key (TPM2_CreatePrimary), so it has no creation data
// or creation ticket; what binds it to the EK is credential activation
// alone. go-attestation (imported as gattest) parses EK certificates and
// event logs here; its ActivationParameters are not used because they
// require the TPM2_Create creation attestation such an AK lacks. Challenges
// are made with go-tpm's tpm2.CreateCredential instead.
//
// Importers: the control plane (internal/fleetd/service, and
// internal/fleetd/bootpolicy for boot policy). It imports neither package
// tpm (the node's side) nor anything that stores or serves. The API is
// internal to nodetrust and may change.
package attest
