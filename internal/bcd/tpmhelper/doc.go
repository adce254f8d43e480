// Package tpmhelper is bcd helper's TPM service and the node's client of it.
//
// The kernel's resource manager (/dev/tpmrm0) filters no command, so whoever
// can open it could change the hierarchies' authorization, clear the TPM or
// trip its lockout. Under [helper] the unprivileged bcd node therefore never
// opens the TPM: bcd helper, which runs as root, owns it and serves a few
// operations on a unix socket ([Serve]), and the node calls them through a
// [Client]. The node does not take the helper's word: the client checks every
// answer (see "What the client checks" below) and returns an error wrapping
// [ErrUntrustedAnswer] when an answer does not check out.
//
// The agent's TPM interface (internal/bcd/agent.TPM) is the part of a TPM
// the node uses. A [Client] implements it through the helper, and
// agent.Direct on a *tpm.TPM the process opened itself, so the agent can use
// either. Its keys are tpm.NodeKey and tpm.AttestationKey.
//
// Importers: bcd's wiring (internal/bcd: Serve for bcd helper, Client for
// bcd node and bcd join). The API is internal to nodetrust and may change.
//
// # Who may call
//
// On every connection the helper reads the peer's credentials (SO_PEERCRED,
// socket(7)): only the configured [helper] user ([Config].AllowedUID) and root
// may call. Anyone else is answered with a refusal (code "denied") and the
// connection is closed; the client returns an error wrapping [ErrDenied].
// Peer credentials exist on Linux only; elsewhere the helper refuses every
// caller.
//
// # Protocol
//
// The protocol is small on purpose: length-prefixed JSON frames on a unix
// stream socket. A frame is a 4-byte big-endian length N followed by N bytes
// of one JSON object (1 <= N <= 64 KiB from the client, 1 MiB from the
// helper). Byte strings are base64 (standard alphabet, padded), as
// encoding/json writes []byte. Unknown fields are ignored.
//
// On accepting a connection the helper sends a greeting, {"v":1}; a refused
// caller gets {"v":1,"code":"denied","error":"…"} instead, and the connection
// is closed. The client then sends requests, one at a time, each answered by
// exactly one response in order. A request is {"op":"tpm.…", …}; a response
// is either the operation's fields or {"code":"…","error":"…"}.
//
// Keys are named by their unique, the 32 random bytes in their record's
// template ([tpm.KeyRecord.Unique]). A record travels as the PEM block
// tpm.MarshalKeyRecord writes ("NODETRUST TPM KEY").
//
//	op            request fields                         response fields
//	tpm.nodekey   record (optional)                      record, public_area, name
//	tpm.ak        record (optional)                      record, public_area, name
//	tpm.sign      unique, digest (SHA-256, 32 bytes)     signature (ASN.1 DER ECDSA)
//	tpm.certify   ak, unique, qualifying_data (<= 64)    attest (TPMS_ATTEST), signature (TPMT_SIGNATURE)
//	tpm.release   unique                                 (none)
//	tpm.ek        ek_kind (optional)                     certificates, ek_kind, public_area
//	tpm.activate  ak, ek_kind, ek_name,                  secret
//	              credential_blob, encrypted_secret
//	tpm.quote     ak, nonce (<= 64), pcrs                quoted (TPMS_ATTEST), signature, pcr_values
//
// tpm.nodekey and tpm.ak derive the key of record with TPM2_CreatePrimary
// (a record that names a key must derive that key, else code
// "key_changed"); without a record they make a new one. The reply's record
// names the key derived. ak is the unique of an AK. ek_kind is "auto",
// "rsa2048", "eccp256" (the low range), "rsa2048h", "eccp256h", "eccp384",
// "eccp521", "rsa3072" or "rsa4096" (the high range); tpm.ek without ek_kind
// answers only the certificates (and the EK certificate chain indices),
// keyed by NV index in decimal, and with it also the EK's
// concrete kind and public area. tpm.activate derives the EK of ek_kind again
// and refuses (code "ek_changed") when its name is not ek_name. pcrs are PCR
// numbers of the SHA-256 bank (0–23); pcr_values is keyed by PCR number in
// decimal. tpm.release of a key the helper does not hold succeeds.
//
// Error codes: "denied" (the caller may not use the helper), "bad_request"
// (a malformed or invalid request), "unknown_key" (the helper holds no key of
// that unique: send its record again with tpm.nodekey or tpm.ak),
// "key_changed" (wraps [tpm.ErrKeyChanged]), "ek_changed" (wraps
// [tpm.ErrEKChanged]), "timeout" (the call took longer than
// [Config].Timeout, 30 seconds by default), "unavailable" (the helper is
// shutting down) and "tpm" (a TPM command failed).
//
// # Keys the helper holds
//
// The helper remembers the records of the keys it was asked for (at most 16,
// least recently used forgotten first) and keeps at most [Config].MaxLoaded of
// them loaded (2 by default, least recently used flushed first), deriving an
// unloaded one again when a call names it. swtpm has no resource manager and
// three object slots: two keys and the one transient object a call may need
// (the EK) fit. tpm.release flushes and forgets a key. When Serve returns, it
// has flushed every key it loaded.
//
// # What the client checks
//
//   - A derived key's public area has exactly the node key's (or the AK's)
//     attributes (tpmpub.CheckNodeKey, tpmpub.CheckAK); the reply's record
//     is the record the node sent (the node makes new records itself, with
//     its own random unique); the key's name is computed by the client from
//     the public area, and must be the one the record names, if any.
//   - A signature verifies against the key's public half (ecdsa.VerifyASN1),
//     else "the helper's signature is not the node key's".
//   - A certification is a TPM_ST_ATTEST_CERTIFY the TPM generated, signed by
//     the AK the helper announced for that AK's record (else "the helper
//     certified with another AK"), naming the key (else "the helper certified
//     another key") with the node's qualifying data.
//   - A quote is a TPM_ST_ATTEST_QUOTE signed by that AK, over the node's
//     nonce and exactly the PCRs asked for, whose digest is that of the values
//     returned.
//   - An EK's public area is of the kind asked for; its name and public key
//     are computed by the client.
//
// The secret tpm.activate returns cannot be checked by the node: the
// verifier that made the credential checks it.
package tpmhelper
