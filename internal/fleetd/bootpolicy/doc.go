// Package bootpolicy decides whether a machine booted as its class's
// policy allows (seed 003, "Attestation and admission" and "Runtime
// identity and withdrawal"). It is fleetd's: `fleetd policy check` calls
// it offline; the service calls it for the tpm join, the renewal of a
// certificate that names an AK and the hourly boot check.
//
// Policies are TOML files, one per machine class, in a directory that
// fleetd.toml names; [Load] reads them all at start and fails on any
// error, so a server never runs with a policy it could not read. A class
// with no policy file has no policy: [Policies.Evaluate] refuses it
// ([ErrUnknownClass]) rather than accept it.
//
// [Policies.Evaluate] verifies the quote (when given), replays the event
// log against the quoted PCRs with package attest, reads the boot state
// from the replayed log, and checks every rule of the policy: Secure Boot,
// the allowed signing authorities, the authorities required at intake or
// at renewal, and the pinned boot applications. The [Verdict] names every
// rule that failed, not only the first. Evidence the TPM did not prove is
// an error, never a verdict, so it can never quarantine anything.
//
// A policy may carry a next state (a pending update) with a window; inside
// it a boot passes when it matches either state and the verdict says which
// ([Verdict.Matched]). [Capture] writes a policy from one machine's verified
// evidence and checks the machine passes it; [Promote] makes the next state
// current; [CountStatus] counts nodes by the state their latest verdict
// matched.
//
// [VerdictLog] appends verdicts to verdicts.jsonl in the state directory,
// rotated by size; [ReadVerdictLogs] reads them back. [ParsePCRs] reads PCR values captured with tpm2-tools
// for an offline check. The package neither logs nor stores: its callers
// do. The format of policies and verdicts is in docs/boot-policy.md.
package bootpolicy
