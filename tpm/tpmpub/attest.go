package tpmpub

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"

	"github.com/google/go-tpm/tpm2"
)

// VerifySignature checks that sig, a marshalled TPMT_SIGNATURE (Part 2,
// section 11.3.4, parsed strictly by [ParseSignature]), is an ECDSA/SHA-256
// signature by ak, a P-256 key, over SHA-256(msg).
func VerifySignature(ak *ecdsa.PublicKey, msg, sig []byte) error {
	s, err := ParseSignature(sig)
	if err != nil {
		return err
	}
	if s.SigAlg != tpm2.TPMAlgECDSA {
		return fmt.Errorf("signature algorithm %#x, want ECDSA (%#x)", uint16(s.SigAlg), uint16(tpm2.TPMAlgECDSA))
	}
	e, err := s.Signature.ECDSA()
	if err != nil {
		return fmt.Errorf("ECDSA signature: %w", err)
	}
	if e.Hash != tpm2.TPMAlgSHA256 {
		return fmt.Errorf("signature hash %#x, want SHA-256 (%#x)", uint16(e.Hash), uint16(tpm2.TPMAlgSHA256))
	}
	const size = 32 // P-256
	if n, m := len(e.SignatureR.Buffer), len(e.SignatureS.Buffer); n == 0 || m == 0 || n > size || m > size {
		return fmt.Errorf("ECDSA signature with r of %d and s of %d bytes, want 1 to %d", n, m, size)
	}
	digest := sha256.Sum256(msg)
	r := new(big.Int).SetBytes(e.SignatureR.Buffer)
	ss := new(big.Int).SetBytes(e.SignatureS.Buffer)
	if !ecdsa.Verify(ak, digest[:], r, ss) {
		return errors.New("the signature is not the AK's over the attestation")
	}
	return nil
}

// CheckAttest parses attest, a TPMS_ATTEST (Part 2, section 10.12.12; the
// contents of a TPM2B_ATTEST), strictly (see [ParseAttest]) and checks that
// it starts with TPM_GENERATED_VALUE and is of type typ. It does not check
// a signature: verify one with [VerifySignature] first.
func CheckAttest(attest []byte, typ tpm2.TPMST) (*tpm2.TPMSAttest, error) {
	a, err := ParseAttest(attest)
	if err != nil {
		return nil, err
	}
	if a.Magic != tpm2.TPMGeneratedValue {
		return nil, fmt.Errorf("TPMS_ATTEST magic %#x, want TPM_GENERATED_VALUE (%#x)", uint32(a.Magic), uint32(tpm2.TPMGeneratedValue))
	}
	if a.Type != typ {
		return nil, fmt.Errorf("TPMS_ATTEST of type %#x, want %#x", uint16(a.Type), uint16(typ))
	}
	return a, nil
}

// ParseSignature unmarshals a TPMT_SIGNATURE strictly: the bytes must be
// exactly the marshalling of what they decode to.
func ParseSignature(b []byte) (*tpm2.TPMTSignature, error) {
	return parseStrict[tpm2.TPMTSignature](b, "TPMT_SIGNATURE")
}

// ParseAttest unmarshals a TPMS_ATTEST strictly: the bytes must be exactly
// the marshalling of what they decode to.
func ParseAttest(b []byte) (*tpm2.TPMSAttest, error) {
	return parseStrict[tpm2.TPMSAttest](b, "TPMS_ATTEST")
}

// parseStrict unmarshals b as a T, which must marshal back to exactly b;
// what names T in errors. A panic in go-tpm's unmarshalling is an error.
func parseStrict[T tpm2.Marshallable, P interface {
	*T
	tpm2.Unmarshallable
}](b []byte, what string) (v *T, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("malformed %s: %v", what, r)
		}
	}()
	if len(b) == 0 {
		return nil, fmt.Errorf("empty %s", what)
	}
	v, err = tpm2.Unmarshal[T, P](b)
	if err != nil {
		return nil, fmt.Errorf("malformed %s: %w", what, err)
	}
	if !bytes.Equal(tpm2.Marshal(*v), b) {
		return nil, fmt.Errorf("malformed %s: trailing or non-canonical data", what)
	}
	return v, nil
}

// EKPublicKey returns the public key in pub, the parsed public area of an
// endorsement key, checking it against want, the EK template it was derived
// from: the same type, and for ECC the same curve (NIST P-256, P-384 or
// P-521, with a point on it); an RSA EK must have the template's modulus
// size (2048, 3072 or 4096 bits). It returns an
// *rsa.PublicKey or an *ecdsa.PublicKey. The object attributes and the
// other parameters are left to the caller.
func EKPublicKey(pub, want tpm2.TPMTPublic) (crypto.PublicKey, error) {
	switch want.Type {
	case tpm2.TPMAlgRSA:
		if pub.Type != tpm2.TPMAlgRSA {
			return nil, fmt.Errorf("EK of type %#x, want RSA", uint16(pub.Type))
		}
		parms, err := pub.Parameters.RSADetail()
		if err != nil {
			return nil, err
		}
		n, err := pub.Unique.RSA()
		if err != nil {
			return nil, err
		}
		k, err := tpm2.RSAPub(parms, n)
		if err != nil {
			return nil, err
		}
		bits := 2048
		if wp, err := want.Parameters.RSADetail(); err == nil && wp.KeyBits != 0 {
			bits = int(wp.KeyBits)
		}
		if k.N.BitLen() != bits {
			return nil, fmt.Errorf("RSA EK of %d bits, want %d", k.N.BitLen(), bits)
		}
		return k, nil
	case tpm2.TPMAlgECC:
		if pub.Type != tpm2.TPMAlgECC {
			return nil, fmt.Errorf("EK of type %#x, want ECC", uint16(pub.Type))
		}
		wp, err := want.Parameters.ECCDetail()
		if err != nil {
			return nil, fmt.Errorf("EK template: %w", err)
		}
		var curve elliptic.Curve
		switch wp.CurveID {
		case tpm2.TPMECCNistP256:
			curve = elliptic.P256()
		case tpm2.TPMECCNistP384:
			curve = elliptic.P384()
		case tpm2.TPMECCNistP521:
			curve = elliptic.P521()
		default:
			return nil, fmt.Errorf("EK template on curve %#x, want NIST P-256, P-384 or P-521", uint16(wp.CurveID))
		}
		parms, err := pub.Parameters.ECCDetail()
		if err != nil {
			return nil, err
		}
		if parms.CurveID != wp.CurveID {
			return nil, fmt.Errorf("EK on curve %#x, want %#x", uint16(parms.CurveID), uint16(wp.CurveID))
		}
		point, err := pub.Unique.ECC()
		if err != nil {
			return nil, err
		}
		return ECPoint(curve, point.X.Buffer, point.Y.Buffer)
	default:
		return nil, fmt.Errorf("EK template of type %#x, want RSA or ECC", uint16(want.Type))
	}
}
