package tpmhelper

import (
	"errors"

	"github.com/nodetrust/nodetrust/tpm"
)

var (
	// ErrDenied is wrapped by the error a client gets from a helper that
	// refused it: its uid is neither the [helper] user's nor root's.
	ErrDenied = errors.New("tpmhelper: the helper refused this caller")
	// ErrTimeout is wrapped by the error of a call that took longer than its
	// timeout (30 seconds by default), on the helper's side or the client's.
	ErrTimeout = errors.New("tpmhelper: the call timed out")
	// ErrUnknownKey is wrapped by the error of a call naming a key the
	// helper does not hold. The client sends the key's record again and
	// retries by itself, so callers rarely see it.
	ErrUnknownKey = errors.New("tpmhelper: the helper holds no such key")
	// ErrUntrustedAnswer is wrapped by the error of a call whose answer does
	// not check out: a signature that is not the key's, a key with other
	// attributes, a certification or quote by another AK. The answer is
	// not used.
	ErrUntrustedAnswer = errors.New("the helper's answer does not check out")
	// ErrClosed is returned by the methods of a Client after its Close,
	// and by those of a Key or AK after their own Close.
	ErrClosed = errors.New("tpmhelper: closed")
	// ErrUnsupported is wrapped when the helper refuses a caller because
	// peer credentials cannot be read on this operating system.
	ErrUnsupported = errors.New("tpmhelper: peer credentials are unsupported on this operating system")
)

// HelperError is a failure the helper answered a call with. It matches
// (errors.Is) [ErrDenied], [ErrTimeout], [ErrUnknownKey], [tpm.ErrKeyChanged]
// or [tpm.ErrEKChanged] according to its code. Its message comes from the
// helper.
type HelperError struct {
	// Op is the operation, such as "tpm.sign", or "connect" for a refusal.
	Op string
	// Code is the wire code (see the package documentation).
	Code string
	// Message is the helper's explanation.
	Message string
}

func (e *HelperError) Error() string { return e.Op + ": " + e.Message }

// Is reports whether the code is target's.
func (e *HelperError) Is(target error) bool {
	switch e.Code {
	case codeDenied:
		return target == ErrDenied
	case codeTimeout:
		return target == ErrTimeout
	case codeUnknownKey:
		return target == ErrUnknownKey
	case codeKeyChanged:
		return target == tpm.ErrKeyChanged
	case codeEKChanged:
		return target == tpm.ErrEKChanged
	}
	return false
}

// untrustedError is an answer that does not check out.
type untrustedError struct {
	op  string
	err error
}

func (e *untrustedError) Error() string   { return e.op + ": " + e.err.Error() }
func (e *untrustedError) Unwrap() []error { return []error{ErrUntrustedAnswer, e.err} }

func untrusted(op string, err error) error { return &untrustedError{op, err} }
