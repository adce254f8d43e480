package pki

import "errors"

// Sentinel errors. Callers branch on them with errors.Is; the wrapping
// message says what exactly failed.
var (
	// ErrOpen means a sealed join token could not be opened: it was sealed
	// to another key or for another CSR, or it was altered.
	ErrOpen = errors.New("join token does not open")

	// ErrRenewProof means a renewal proof of possession does not verify.
	ErrRenewProof = errors.New("renewal proof of possession refused")

	// ErrExists means [Init] found one of its files already present and
	// wrote nothing.
	ErrExists = errors.New("pki file already exists")
)
