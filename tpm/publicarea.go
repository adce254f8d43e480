package tpm

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// The object attributes (TPMA_OBJECT, Part 2, section 8.3) of the keys this
// package derives. Both are fixedTPM and fixedParent (they never leave this
// TPM), sensitiveDataOrigin (the TPM made the private key), userWithAuth with
// an empty authValue and noDA (using them never counts toward dictionary
// attack lockout), and sign.
var (
	nodeKeyAttributes = tpm2.TPMAObject{
		FixedTPM:            true,
		FixedParent:         true,
		SensitiveDataOrigin: true,
		UserWithAuth:        true,
		NoDA:                true,
		SignEncrypt:         true,
	}
	// The AK is also restricted: it signs only structures the TPM made
	// itself (quotes, certifications), never an outside digest that could
	// look like one (Part 1, section 25.2 "Restricted signing keys").
	akAttributes = tpm2.TPMAObject{
		FixedTPM:            true,
		FixedParent:         true,
		SensitiveDataOrigin: true,
		UserWithAuth:        true,
		NoDA:                true,
		Restricted:          true,
		SignEncrypt:         true,
	}
)

// eccSigningTemplate is an ECC NIST P-256 signing key with the ECDSA/SHA-256
// scheme and SHA-256 names (Part 2, section 12.2.4 TPMT_PUBLIC). unique goes
// into the unique field's x coordinate (y stays empty): TPM2_CreatePrimary
// takes it as entropy for the derivation and returns the public point there.
func eccSigningTemplate(attrs tpm2.TPMAObject, unique []byte) tpm2.TPMTPublic {
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

func nodeKeyTemplate(unique []byte) tpm2.TPMTPublic {
	return eccSigningTemplate(nodeKeyAttributes, unique)
}

func akTemplate(unique []byte) tpm2.TPMTPublic {
	return eccSigningTemplate(akAttributes, unique)
}

// CheckNodeKeyAttributes checks that publicArea, a TPMT_PUBLIC (the contents
// of a TPM2B_PUBLIC, Part 2, section 12.2.5) as [Key.PublicArea] returns it,
// describes a node key as this package derives it: an ECC NIST P-256 key with
// SHA-256 names, no authPolicy, the ECDSA/SHA-256 scheme, exactly the
// attributes fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth, noDA
// and sign (so not restricted, not decrypt), and a valid P-256 point.
//
// The node uses it on the public area bcd helper answers with. It tells what
// the public area says; that the key is in a TPM is only as true as the
// source of the public area (a certification by a trusted AK shows it).
func CheckNodeKeyAttributes(publicArea []byte) error {
	if _, err := checkPublicArea(publicArea, nodeKeyTemplate(nil)); err != nil {
		return fmt.Errorf("node key public area: %w", err)
	}
	return nil
}

// CheckAKAttributes is [CheckNodeKeyAttributes] for an AK as [TPM.NewAK]
// derives it: the same, and restricted.
func CheckAKAttributes(publicArea []byte) error {
	if _, err := checkPublicArea(publicArea, akTemplate(nil)); err != nil {
		return fmt.Errorf("AK public area: %w", err)
	}
	return nil
}

// checkPublicArea parses publicArea, checks it is of want's kind, and returns
// its public key.
func checkPublicArea(publicArea []byte, want tpm2.TPMTPublic) (*ecdsa.PublicKey, error) {
	pub, err := parsePublicArea(publicArea)
	if err != nil {
		return nil, err
	}
	if err := checkSameKind(pub, want); err != nil {
		return nil, err
	}
	return eccPublicKey(pub)
}

// parsePublicArea unmarshals a TPMT_PUBLIC strictly: the bytes must be
// exactly the marshalling of what they decode to (no trailing data).
func parsePublicArea(b []byte) (pub tpm2.TPMTPublic, err error) {
	defer func() {
		// go-tpm's reflection-based (un)marshalling should not panic on
		// malformed input; do not let it take the process down if it does.
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed TPMT_PUBLIC: %v", r)
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

// checkSameKind compares every field of got but the unique field with want.
func checkSameKind(got, want tpm2.TPMTPublic) error {
	if got.Type != tpm2.TPMAlgECC {
		return fmt.Errorf("type %#x, want ECC (%#x)", uint16(got.Type), uint16(tpm2.TPMAlgECC))
	}
	if got.NameAlg != want.NameAlg {
		return fmt.Errorf("nameAlg %#x, want SHA-256 (%#x)", uint16(got.NameAlg), uint16(want.NameAlg))
	}
	if g, w := attrBits(got.ObjectAttributes), attrBits(want.ObjectAttributes); g != w {
		return fmt.Errorf("object attributes %#08x, want %#08x (differing bits %#08x)", g, w, g^w)
	}
	if len(got.AuthPolicy.Buffer) != 0 {
		return errors.New("an authPolicy is set, want none")
	}
	gp, err := got.Parameters.ECCDetail()
	if err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	if gp.CurveID != tpm2.TPMECCNistP256 {
		return fmt.Errorf("curve %#x, want NIST P-256 (%#x)", uint16(gp.CurveID), uint16(tpm2.TPMECCNistP256))
	}
	if !bytes.Equal(marshalParms(got.Parameters), marshalParms(want.Parameters)) {
		return errors.New("parameters differ from symmetric NULL, scheme ECDSA with SHA-256, curve NIST P-256, kdf NULL")
	}
	return nil
}

func marshalParms(p tpm2.TPMUPublicParms) []byte {
	d, err := p.ECCDetail()
	if err != nil {
		return nil
	}
	return tpm2.Marshal(d)
}

func attrBits(a tpm2.TPMAObject) uint32 {
	return binary.BigEndian.Uint32(tpm2.Marshal(a))
}

// eccPublicKey returns the P-256 public key of pub, checking that the point
// is on the curve.
func eccPublicKey(pub tpm2.TPMTPublic) (*ecdsa.PublicKey, error) {
	point, err := pub.Unique.ECC()
	if err != nil {
		return nil, fmt.Errorf("unique field: %w", err)
	}
	return parseP256Point(point.X.Buffer, point.Y.Buffer)
}

func parseP256Point(x, y []byte) (*ecdsa.PublicKey, error) {
	return parseECPoint(elliptic.P256(), x, y)
}

// parseECPoint returns the public key at (x, y), checking that the point is
// on curve. The TPM may drop leading zero bytes of a coordinate.
func parseECPoint(curve elliptic.Curve, x, y []byte) (*ecdsa.PublicKey, error) {
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
