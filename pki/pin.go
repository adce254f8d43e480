package pki

import (
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// PinPrefix starts every pin's text form.
const PinPrefix = "sha256:"

// pinTextLen is the length of a pin's text form.
const pinTextLen = len(PinPrefix) + 2*sha256.Size

// Pin identifies a public key: the SHA-256 of its SubjectPublicKeyInfo DER.
// Its text form is "sha256:" followed by 64 lower-case hex digits.
//
// The zero Pin is not the pin of any key; [Pin.IsZero] reports it, and
// callers must treat a zero Pin as "not configured", never as a match.
type Pin [sha256.Size]byte

// ParsePin parses the text form of a pin. It accepts exactly "sha256:" and
// 64 lower-case hex digits; anything else is an error that says what is
// wrong (missing prefix, wrong length, upper-case or non-hex digits).
// The all-zero pin is refused too.
func ParsePin(s string) (Pin, error) {
	var p Pin
	if !strings.HasPrefix(s, PinPrefix) {
		return p, fmt.Errorf("parse pin %s: missing %q prefix", quoteShort(s), PinPrefix)
	}
	h := s[len(PinPrefix):]
	if len(h) != 2*sha256.Size {
		return p, fmt.Errorf("parse pin %s: want %d hex digits after %q, have %d", quoteShort(s), 2*sha256.Size, PinPrefix, len(h))
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			return p, fmt.Errorf("parse pin %s: hex digits must be lower case", quoteShort(s))
		default:
			return p, fmt.Errorf("parse pin %s: %q at offset %d is not a hex digit", quoteShort(s), c, len(PinPrefix)+i)
		}
	}
	if _, err := hex.Decode(p[:], []byte(h)); err != nil {
		return Pin{}, fmt.Errorf("parse pin %s: %w", quoteShort(s), err)
	}
	if p.IsZero() {
		return Pin{}, fmt.Errorf("parse pin %s: all zero, not the pin of a key", quoteShort(s))
	}
	return p, nil
}

// quoteShort quotes s for an error message, cutting it to a readable length.
func quoteShort(s string) string {
	const max = pinTextLen + 8
	if len(s) > max {
		return fmt.Sprintf("%q...", s[:max])
	}
	return fmt.Sprintf("%q", s)
}

// PinOf returns the pin of a public key: SHA-256 over
// x509.MarshalPKIXPublicKey(pub). It accepts what that function accepts,
// including *ecdh.PublicKey (whose SPKI for P-256 is the same as the
// matching *ecdsa.PublicKey's).
func PinOf(pub crypto.PublicKey) (Pin, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return Pin{}, fmt.Errorf("pin of %T: %w", pub, err)
	}
	return sha256.Sum256(der), nil
}

// PinOfCert returns the pin of a certificate's public key, hashing the
// certificate's own SubjectPublicKeyInfo bytes.
func PinOfCert(c *x509.Certificate) Pin {
	return sha256.Sum256(c.RawSubjectPublicKeyInfo)
}

// PinOfSPKI returns the pin of a SubjectPublicKeyInfo DER.
func PinOfSPKI(spki []byte) Pin { return sha256.Sum256(spki) }

// String returns the text form "sha256:<64 lower-case hex digits>".
func (p Pin) String() string {
	return PinPrefix + hex.EncodeToString(p[:])
}

// IsZero reports whether p is the zero Pin (not set).
func (p Pin) IsZero() bool { return p == Pin{} }

// Equal reports whether p and q are the same pin, in constant time.
// A zero pin equals nothing, not even another zero pin.
func (p Pin) Equal(q Pin) bool {
	if p.IsZero() || q.IsZero() {
		return false
	}
	return subtle.ConstantTimeCompare(p[:], q[:]) == 1
}

// MarshalText returns the text form. The zero Pin cannot be marshalled,
// so a missing pin is never written as if it were one.
func (p Pin) MarshalText() ([]byte, error) {
	if p.IsZero() {
		return nil, errors.New("marshal pin: pin is not set")
	}
	return []byte(p.String()), nil
}

// UnmarshalText parses the text form with [ParsePin].
func (p *Pin) UnmarshalText(b []byte) error {
	q, err := ParsePin(string(b))
	if err != nil {
		return err
	}
	*p = q
	return nil
}

// SerialHex is a certificate's serial number as the control plane records
// it: lower-case hex of the number's big-endian bytes.
func SerialHex(c *x509.Certificate) string { return serialHex(c.SerialNumber) }

// serialHex is SerialHex of a serial number not yet parsed into a
// certificate (IssuedLeaf.SerialHex).
func serialHex(n *big.Int) string { return hex.EncodeToString(n.Bytes()) }
