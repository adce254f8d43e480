// Package tpm is the node's TPM 2.0 client: it opens a TPM, derives the node
// key and the attestation key (AK) in it, and produces the evidence a verifier
// asks for — the EK certificates and the EK, credential activation, quotes and
// certifications. It makes no policy decision and verifies no evidence: the
// control plane's verifier does that, from the bytes this package returns.
//
// The same code runs on the host's device (/dev/tpmrm0, behind the kernel's
// resource manager), on a TPM over TCP such as swtpm (no resource manager, one
// connection at a time) and on the in-process reference simulator
// (package tpmsim, build tag tpmsim). Because of swtpm, every transient object
// and session a command loads is flushed with TPM2_FlushContext on every path,
// including errors; only a [Key] or [AK] stays loaded, until its Close.
//
// Keys are primary keys: TPM2_CreatePrimary derives them from the owner
// hierarchy's seed and a template whose unique field holds 32 random bytes
// (TPM 2.0 Part 1, section 27.1 "Primary keys"; Part 3, section 24.1). The
// template is stored in a [KeyRecord] (PEM "NODETRUST TPM KEY"), which is not a
// secret: the same record derives the same key on the same TPM, and another
// key once the owner hierarchy is cleared.
//
// All commands on one [TPM] are serialized by a mutex, and the context is
// checked before each command. The package does not log.
//
// Importers: the node's side (agent, bcd helper, bcd doctor, fleetd dev with
// the simulator). The verifier does not import it: it works from the bytes
// alone. Subpackages: tpmsim (the simulator, build tag tpmsim) and tpmtest
// (swtpm and credential challenges for tests). The API is internal to
// nodetrust and may change.
package tpm
