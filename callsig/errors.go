package callsig

import (
	"errors"
	"fmt"
)

// ErrMalformed means bytes given to an UnmarshalBinary method, or a value
// given to a Marshal or Sign method, do not follow the format of
// docs/callsig.md: a field is missing, too long or of the wrong size, the
// version is unknown, or bytes follow the last field. The wrapping message
// names the field.
var ErrMalformed = errors.New("malformed")

// The checks a [Rejection] names, in the order [Verifier.Verify] makes them.
// Each is also the first words of the rejection's message.
const (
	// CheckNoSignature: the call carries no signature (no envelope, or an
	// envelope without one).
	CheckNoSignature = "no signature"
	// CheckMalformed: the envelope breaks the limits of the format (an
	// empty or oversized field, a signature of the wrong size).
	CheckMalformed = "malformed"
	// CheckUnknownSender: the daemon has no key for the sender the call
	// gives, such as an instance whose process does not run.
	CheckUnknownSender = "unknown sender"
	// CheckSignature: the signature does not verify with the key of the
	// sender the call gives, such as a node that calls under the id of
	// another client.
	CheckSignature = "bad signature"
	// CheckNamespace: the call is signed for another namespace.
	CheckNamespace = "namespace"
	// CheckTimestamp: the call's timestamp is more than [Window] away from
	// the daemon's clock, in the past or in the future.
	CheckTimestamp = "timestamp"
	// CheckReplay: a call of the last [Window] carried the same nonce.
	CheckReplay = "replay"
	// CheckReplayCacheFull: the replay cache holds its maximum number of
	// nonces, so the daemon cannot remember this call's nonce and refuses
	// it rather than grow. Later calls succeed as entries expire.
	CheckReplayCacheFull = "replay cache full"
	// CheckMachineProof: a call of another machine has no machine proof, or
	// one that does not verify, or names another sender than the proof.
	CheckMachineProof = "machine proof"
)

// Rejection is the refusal of a call. Check is one of the Check constants;
// Msg names the check and says what failed, and is meant to be sent back
// to the caller (it holds nothing the caller did not send, apart from the
// daemon's own namespace and limits). Callers branch on Check with
// errors.As:
//
//	var r *callsig.Rejection
//	if errors.As(err, &r) && r.Check == callsig.CheckReplay { … }
type Rejection struct {
	Check string
	Msg   string

	// cause is the underlying error, such as an x509 verification error.
	cause error
}

// Error returns "rejected: " followed by Msg.
func (r *Rejection) Error() string { return "rejected: " + r.Msg }

// Unwrap returns the underlying error, if any (for a machine proof, the
// certificate parsing or verification error).
func (r *Rejection) Unwrap() error { return r.cause }

// reject returns a Rejection whose message is check + ": " + the formatted
// detail.
func reject(check, format string, args ...any) *Rejection {
	return &Rejection{Check: check, Msg: check + ": " + fmt.Sprintf(format, args...)}
}

// rejectCause is reject with an underlying error, which the message does not
// repeat unless format includes it.
func rejectCause(cause error, check, format string, args ...any) *Rejection {
	r := reject(check, format, args...)
	r.cause = cause
	return r
}
