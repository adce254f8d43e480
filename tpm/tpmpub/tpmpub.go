package tpmpub

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"

	"github.com/google/go-tpm/tpm2"
)

// The object attributes (TPMA_OBJECT, Part 2, section 8.3) of the keys
// nodetrust derives. Both are fixedTPM and fixedParent (they never leave
// their TPM), sensitiveDataOrigin (the TPM made the private key),
// userWithAuth with an empty authValue and noDA (using them never counts
// toward dictionary attack lockout), and sign.
var (
	// NodeKeyAttributes are the node key's attributes.
	NodeKeyAttributes = tpm2.TPMAObject{
		FixedTPM:            true,
		FixedParent:         true,
		SensitiveDataOrigin: true,
		UserWithAuth:        true,
		NoDA:                true,
		SignEncrypt:         true,
	}
	// AKAttributes are the AK's attributes: the node key's, and restricted,
	// so that it signs only structures the TPM made itself (quotes,
	// certifications), never an outside digest that could look like one
	// (Part 1, section 25.2 "Restricted signing keys").
	AKAttributes = tpm2.TPMAObject{
		FixedTPM:            true,
		FixedParent:         true,
		SensitiveDataOrigin: true,
		UserWithAuth:        true,
		NoDA:                true,
		Restricted:          true,
		SignEncrypt:         true,
	}
)

// ECCSigningTemplate is an ECC NIST P-256 signing key with attrs, the
// ECDSA/SHA-256 scheme and SHA-256 names (Part 2, section 12.2.4
// TPMT_PUBLIC). unique goes into the unique field's x coordinate (y stays
// empty): TPM2_CreatePrimary takes it as entropy for the derivation and
// returns the public point there.
func ECCSigningTemplate(attrs tpm2.TPMAObject, unique []byte) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:             tpm2.TPMAlgECC,
		NameAlg:          tpm2.TPMAlgSHA256,
		ObjectAttributes: attrs,
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme: tpm2.TPMTECCScheme{
				Scheme: tpm2.TPMAlgECDSA,
				Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA,
					&tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
			},
			CurveID: tpm2.TPMECCNistP256,
			KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: unique},
		}),
	}
}

// NodeKeyTemplate is the node key's template: [ECCSigningTemplate] with
// [NodeKeyAttributes].
func NodeKeyTemplate(unique []byte) tpm2.TPMTPublic {
	return ECCSigningTemplate(NodeKeyAttributes, unique)
}

// AKTemplate is the AK's template: [ECCSigningTemplate] with [AKAttributes].
func AKTemplate(unique []byte) tpm2.TPMTPublic {
	return ECCSigningTemplate(AKAttributes, unique)
}

// CheckNodeKey checks that publicArea, a TPMT_PUBLIC (the contents of a
// TPM2B_PUBLIC, Part 2, section 12.2.5), describes a node key as package tpm
// derives it: an ECC NIST P-256 key with SHA-256 names, no authPolicy, the
// ECDSA/SHA-256 scheme, exactly [NodeKeyAttributes] (so not restricted, not
// decrypt), and a valid P-256 point, which it returns.
func CheckNodeKey(publicArea []byte) (*ecdsa.PublicKey, error) {
	return Check(publicArea, NodeKeyTemplate(nil))
}

// CheckAK is [CheckNodeKey] for an AK as package tpm derives it: exactly
// [AKAttributes].
func CheckAK(publicArea []byte) (*ecdsa.PublicKey, error) {
	return Check(publicArea, AKTemplate(nil))
}

// Check parses publicArea, checks that it is of want's kind (see
// [CheckSameKind]; want is an [ECCSigningTemplate]) and returns its P-256
// public key.
func Check(publicArea []byte, want tpm2.TPMTPublic) (*ecdsa.PublicKey, error) {
	pub, err := Parse(publicArea)
	if err != nil {
		return nil, err
	}
	if err := CheckSameKind(pub, want); err != nil {
		return nil, err
	}
	return P256PublicKey(pub)
}

// ParseP256Signing parses publicArea and checks that it is an ECC NIST P-256
// key with SHA-256 names, the ECDSA/SHA-256 scheme, no symmetric algorithm
// and no KDF, with a valid point; its attributes and authPolicy are left to
// the caller. It returns the parsed public area and the public key.
func ParseP256Signing(publicArea []byte) (tpm2.TPMTPublic, *ecdsa.PublicKey, error) {
	pub, err := Parse(publicArea)
	if err != nil {
		return tpm2.TPMTPublic{}, nil, err
	}
	want := ECCSigningTemplate(tpm2.TPMAObject{}, nil)
	if err := checkType(pub, want); err != nil {
		return tpm2.TPMTPublic{}, nil, err
	}
	if err := checkECCParameters(pub, want); err != nil {
		return tpm2.TPMTPublic{}, nil, err
	}
	key, err := P256PublicKey(pub)
	if err != nil {
		return tpm2.TPMTPublic{}, nil, err
	}
	return pub, key, nil
}

// Parse unmarshals a TPMT_PUBLIC strictly: the bytes must be exactly the
// marshalling of what they decode to (no trailing data), so that a name
// computed over them is the one the TPM computes.
func Parse(b []byte) (pub tpm2.TPMTPublic, err error) {
	defer func() {
		// go-tpm's reflection-based (un)marshalling should not panic on
		// malformed input; do not let it take the process down if it does.
		if r := recover(); r != nil {
			pub, err = tpm2.TPMTPublic{}, fmt.Errorf("malformed TPMT_PUBLIC: %v", r)
		}
	}()
	if len(b) == 0 {
		return tpm2.TPMTPublic{}, errors.New("empty TPMT_PUBLIC")
	}
	p, err := tpm2.Unmarshal[tpm2.TPMTPublic](b)
	if err != nil {
		return tpm2.TPMTPublic{}, fmt.Errorf("malformed TPMT_PUBLIC: %w", err)
	}
	if !bytes.Equal(tpm2.Marshal(p), b) {
		return tpm2.TPMTPublic{}, errors.New("malformed TPMT_PUBLIC: trailing or non-canonical data")
	}
	return *p, nil
}

// Name returns the TPM name of the object whose TPMT_PUBLIC is publicArea
// (Part 1, section 16 "Names"): its nameAlg (2 bytes, big-endian) followed
// by the nameAlg digest of publicArea. It parses publicArea strictly (see
// [Parse]) and supports the nameAlgs SHA-1, SHA-256, SHA-384 and SHA-512.
// It computes the name itself: a name a peer claims proves nothing.
func Name(publicArea []byte) ([]byte, error) {
	pub, err := Parse(publicArea)
	if err != nil {
		return nil, err
	}
	var d hash.Hash
	switch pub.NameAlg {
	case tpm2.TPMAlgSHA1:
		d = sha1.New()
	case tpm2.TPMAlgSHA256:
		d = sha256.New()
	case tpm2.TPMAlgSHA384:
		d = sha512.New384()
	case tpm2.TPMAlgSHA512:
		d = sha512.New()
	default:
		return nil, fmt.Errorf("nameAlg %#x: not SHA-1, SHA-256, SHA-384 or SHA-512", uint16(pub.NameAlg))
	}
	d.Write(publicArea)
	name := binary.BigEndian.AppendUint16(make([]byte, 0, 2+d.Size()), uint16(pub.NameAlg))
	return d.Sum(name), nil
}

// CheckSameKind compares every field of got but the unique field with want,
// an [ECCSigningTemplate].
func CheckSameKind(got, want tpm2.TPMTPublic) error {
	if err := checkType(got, want); err != nil {
		return err
	}
	// TPMAObject is comparable, reserved bits included.
	if got.ObjectAttributes != want.ObjectAttributes {
		g, w := AttributeBits(got.ObjectAttributes), AttributeBits(want.ObjectAttributes)
		return fmt.Errorf("object attributes %#08x, want %#08x (differing bits %#08x)", g, w, g^w)
	}
	if len(got.AuthPolicy.Buffer) != 0 {
		return errors.New("an authPolicy is set, want none")
	}
	return checkECCParameters(got, want)
}

func checkType(got, want tpm2.TPMTPublic) error {
	if got.Type != tpm2.TPMAlgECC {
		return fmt.Errorf("type %#x, want ECC (%#x)", uint16(got.Type), uint16(tpm2.TPMAlgECC))
	}
	if got.NameAlg != want.NameAlg {
		return fmt.Errorf("nameAlg %#x, want SHA-256 (%#x)", uint16(got.NameAlg), uint16(want.NameAlg))
	}
	return nil
}

func checkECCParameters(got, want tpm2.TPMTPublic) error {
	gp, err := got.Parameters.ECCDetail()
	if err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	if gp.CurveID != tpm2.TPMECCNistP256 {
		return fmt.Errorf("curve %#x, want NIST P-256 (%#x)", uint16(gp.CurveID), uint16(tpm2.TPMECCNistP256))
	}
	if !bytes.Equal(marshalECCParms(got.Parameters), marshalECCParms(want.Parameters)) {
		return errors.New("parameters differ from symmetric NULL, scheme ECDSA with SHA-256, curve NIST P-256, kdf NULL")
	}
	return nil
}

func marshalECCParms(p tpm2.TPMUPublicParms) []byte {
	d, err := p.ECCDetail()
	if err != nil {
		return nil
	}
	return tpm2.Marshal(d)
}

// AttributeBits returns a TPMA_OBJECT as the 32-bit value the TPM marshals.
func AttributeBits(a tpm2.TPMAObject) uint32 {
	return binary.BigEndian.Uint32(tpm2.Marshal(a))
}

// P256PublicKey returns the P-256 public key in pub's unique field,
// checking that the point is on the curve.
func P256PublicKey(pub tpm2.TPMTPublic) (*ecdsa.PublicKey, error) {
	point, err := pub.Unique.ECC()
	if err != nil {
		return nil, fmt.Errorf("unique field: %w", err)
	}
	return ECPoint(elliptic.P256(), point.X.Buffer, point.Y.Buffer)
}

// ECPoint returns the public key at (x, y), checking that the point is on
// curve. The TPM may drop leading zero bytes of a coordinate.
func ECPoint(curve elliptic.Curve, x, y []byte) (*ecdsa.PublicKey, error) {
	size := (curve.Params().BitSize + 7) / 8
	if len(x) > size || len(y) > size || len(x) == 0 || len(y) == 0 {
		return nil, fmt.Errorf("ECC point with coordinates of %d and %d bytes, want %d", len(x), len(y), size)
	}
	enc := make([]byte, 1+2*size)
	enc[0] = 4
	copy(enc[1+size-len(x):1+size], x)
	copy(enc[1+2*size-len(y):], y)
	k, err := ecdsa.ParseUncompressedPublicKey(curve, enc)
	if err != nil {
		return nil, fmt.Errorf("ECC point: %w", err)
	}
	return k, nil
}
