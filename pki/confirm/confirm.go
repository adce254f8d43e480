// Package confirm is the confirmation a node signs with its LDevID's device
// key when it asks for installation (seed 003, "Attestation and
// admission"): it binds the intake session, the network report sent with
// it and the time it was signed, so that the session id — which appears in
// logs — is never a credential by itself, and a confirmation cannot be
// replayed with another report or long after it was made.
package confirm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/pki"
)

// Label starts the signed encoding, so that a confirmation's signature is
// valid for nothing else the device key signs (a network report has a
// label of its own).
const Label = "nodetrust install-confirmation v1"

// MaxSessionID bounds the session id a confirmation names.
const MaxSessionID = 128

// Confirmation is a request for installation.
type Confirmation struct {
	// SessionID is the intake session's id.
	SessionID string
	// ReportDigest is SHA-256 of the network report's canonical encoding
	// (netreport.Digest).
	ReportDigest []byte
	// At is when the node signed it.
	At time.Time
}

// Canonical is the signed encoding: Label, 0x00, the session id with a
// uint32 big-endian length prefix, the 32-byte report digest, and At as
// int64 big-endian Unix nanoseconds.
func (c Confirmation) Canonical() []byte {
	b := make([]byte, 0, len(Label)+1+4+len(c.SessionID)+sha256.Size+8)
	b = append(b, Label...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(c.SessionID)))
	b = append(b, c.SessionID...)
	b = append(b, c.ReportDigest...)
	return binary.BigEndian.AppendUint64(b, uint64(c.At.UnixNano()))
}

func (c Confirmation) check() error {
	switch {
	case c.SessionID == "" || len(c.SessionID) > MaxSessionID:
		return fmt.Errorf("confirmation: the session id must be 1 to %d bytes", MaxSessionID)
	case len(c.ReportDigest) != sha256.Size:
		return fmt.Errorf("confirmation: the report digest is %d bytes, want %d", len(c.ReportDigest), sha256.Size)
	case c.At.IsZero():
		return errors.New("confirmation: no time")
	}
	return nil
}

func (c Confirmation) digest() []byte {
	d := sha256.Sum256(c.Canonical())
	return d[:]
}

// Sign signs c with the device key (an ECDSA key; in a TPM, behind
// crypto.Signer) and returns the IEEE P1363 signature.
func Sign(c Confirmation, device crypto.Signer) ([]byte, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if device == nil {
		return nil, errors.New("sign the confirmation: no device key")
	}
	sig, err := pki.SignP1363(device, c.digest())
	if err != nil {
		return nil, fmt.Errorf("sign the confirmation: %w", err)
	}
	return sig, nil
}

// ErrSignature is a confirmation whose signature is not the device key's.
var ErrSignature = errors.New("confirmation: the signature is not the device key's")

// Verify checks that the device key pub signed c. It checks nothing about
// c's age: that is the verifier's policy.
func Verify(c Confirmation, pub crypto.PublicKey, sig []byte) error {
	if err := c.check(); err != nil {
		return err
	}
	ec, ok := pub.(*ecdsa.PublicKey)
	if !ok || ec == nil {
		return fmt.Errorf("confirmation: the device key is %T, want ECDSA", pub)
	}
	if !pki.VerifyP1363(ec, c.digest(), sig) {
		return ErrSignature
	}
	return nil
}
