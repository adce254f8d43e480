package attest

import "errors"

// Sentinel errors. Every error of this package wraps the sentinel of the
// operation that failed; one about the AK's public area also wraps [ErrAK],
// and one about the EK's public area (in [NewChallenge]) [ErrUntrustedEK].
// Callers branch with errors.Is; the message after the sentinel says which
// check failed, for the server's log only (a refused node is told "Join
// refused").
var (
	// ErrUntrustedEK: the EK certificate does not chain to a configured
	// manufacturer root at the verifier's time, does not certify the EK, or
	// the EK public area is not of a TCG EK template.
	ErrUntrustedEK = errors.New("attest: EK not trusted")
	// ErrActivation: a credential-activation challenge could not be made
	// for the EK and AK given, or the node's answer is not its secret.
	ErrActivation = errors.New("attest: credential activation failed")
	// ErrQuote: the quote is not a valid, fresh AK quote of the SHA-256
	// PCRs 0–7 with the PCR values given.
	ErrQuote = errors.New("attest: quote refused")
	// ErrEventLog: the event log does not parse, or does not replay to the
	// quoted PCR values, or its Secure Boot state cannot be determined.
	ErrEventLog = errors.New("attest: event log refused")
	// ErrCertify: the certification is not a valid AK TPM2_Certify of a
	// node key over the CSR's SHA-256.
	ErrCertify = errors.New("attest: key certification refused")
	// ErrAK: the AK public area is not a restricted, TPM-made ECDSA P-256
	// signing key.
	ErrAK = errors.New("attest: not an acceptable attestation key")
)

// partError is an error about one piece of evidence, such as the AK's public
// area. It wraps the sentinel for that piece without repeating its text, so
// that an operation's error reads "attest: quote refused: AK public area: …"
// and still matches errors.Is(err, ErrAK).
type partError struct {
	sentinel error
	what     string
	err      error
}

func (e partError) Error() string   { return e.what + ": " + e.err.Error() }
func (e partError) Unwrap() []error { return []error{e.sentinel, e.err} }
