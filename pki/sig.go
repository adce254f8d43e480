package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
)

// ecdsaASN1 is the DER form of an ECDSA signature (RFC 3279).
type ecdsaASN1 struct {
	R, S *big.Int
}

// SignP1363 signs a SHA-256 digest with an ECDSA key and returns the IEEE
// P1363 form r||s, each half as wide as the curve's order (64 bytes in all
// for P-256). The signer may answer in ASN.1 DER, as crypto.Signer's
// contract for ECDSA says, or already in r||s form (some hardware
// signers); both are accepted and the result is always r||s.
func SignP1363(signer crypto.Signer, digest []byte) ([]byte, error) {
	if signer == nil {
		return nil, errors.New("sign: no signer")
	}
	pub, ok := signer.Public().(*ecdsa.PublicKey)
	if !ok || pub == nil {
		return nil, fmt.Errorf("sign: key is %T, want ECDSA", signer.Public())
	}
	if len(digest) != sha256.Size {
		return nil, fmt.Errorf("sign: digest is %d bytes, want %d (SHA-256)", len(digest), sha256.Size)
	}
	sig, err := signer.Sign(rand.Reader, digest, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	n := scalarSize(pub)
	var v ecdsaASN1
	if rest, err := asn1.Unmarshal(sig, &v); err == nil && len(rest) == 0 {
		if v.R == nil || v.S == nil || v.R.Sign() <= 0 || v.S.Sign() <= 0 ||
			len(v.R.Bytes()) > n || len(v.S.Bytes()) > n {
			return nil, errors.New("sign: signer returned an out-of-range signature")
		}
		out := make([]byte, 2*n)
		v.R.FillBytes(out[:n])
		v.S.FillBytes(out[n:])
		return out, nil
	}
	if len(sig) == 2*n {
		return sig, nil
	}
	return nil, fmt.Errorf("sign: signer returned %d bytes, neither ASN.1 nor r||s", len(sig))
}

// VerifyP1363 reports whether sig is a valid IEEE P1363 (r||s) signature of
// the SHA-256 digest by pub. A signature of the wrong length is invalid.
func VerifyP1363(pub *ecdsa.PublicKey, digest, sig []byte) bool {
	if pub == nil || pub.Curve == nil {
		return false
	}
	n := scalarSize(pub)
	if len(sig) != 2*n {
		return false
	}
	r := new(big.Int).SetBytes(sig[:n])
	s := new(big.Int).SetBytes(sig[n:])
	return ecdsa.Verify(pub, digest, r, s)
}

// scalarSize is the byte width of one half of a P1363 signature.
func scalarSize(pub *ecdsa.PublicKey) int {
	return (pub.Curve.Params().N.BitLen() + 7) / 8
}
