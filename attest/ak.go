package attest

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// checkAK checks that akPublicArea, a TPMT_PUBLIC (the contents of a
// TPM2B_PUBLIC, TPM 2.0 Part 2, section 12.2.5), is an acceptable AK and
// returns its public key. An AK must be:
//
//   - an ECC NIST P-256 key with SHA-256 names and the ECDSA/SHA-256 scheme
//     (no symmetric algorithm, no KDF), with a valid point;
//   - restricted and sign: it signs only what the TPM made itself, each
//     structure starting with TPM_GENERATED_VALUE (Part 1, section 25.2),
//     so an outsider cannot have it sign a forged quote;
//   - fixedTPM, fixedParent and sensitiveDataOrigin: the TPM made the
//     private key and it can never leave that TPM;
//   - not decrypt.
//
// Its other attributes (userWithAuth, noDA, adminWithPolicy…) and its
// authPolicy govern who may use it in its TPM and are not checked. The AK
// package tpm derives ([tpmpub.AKAttributes]) is one such key.
//
// That the public area describes a key in a TPM at all is proven only by
// credential activation with a trusted EK: until then it is a claim.
//
// Its errors wrap [ErrAK].
func checkAK(akPublicArea []byte) (*ecdsa.PublicKey, error) {
	pub, key, err := tpmpub.ParseP256Signing(akPublicArea)
	if err != nil {
		return nil, akError(err)
	}
	if err := checkAKAttributes(pub.ObjectAttributes); err != nil {
		return nil, akError(err)
	}
	return key, nil
}

func akError(err error) error { return partError{ErrAK, "AK public area", err} }

// akName checks akPublicArea with checkAK and computes its name.
func akName(akPublicArea []byte) ([]byte, error) {
	if _, err := checkAK(akPublicArea); err != nil {
		return nil, err
	}
	return sha256Name(akPublicArea), nil
}

// sha256Name is the TPM name of an object whose public area was parsed
// strictly and has nameAlg SHA-256 (Part 1, section 16): TPM_ALG_SHA256
// followed by the SHA-256 of the public area. It is tpmpub.Name without
// parsing the public area again.
func sha256Name(publicArea []byte) []byte {
	h := sha256.Sum256(publicArea)
	return append([]byte{0x00, byte(tpm2.TPMAlgSHA256)}, h[:]...)
}

func checkAKAttributes(a tpm2.TPMAObject) error {
	var missing, extra []string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"fixedTPM", a.FixedTPM},
		{"fixedParent", a.FixedParent},
		{"sensitiveDataOrigin", a.SensitiveDataOrigin},
		{"restricted", a.Restricted},
		{"sign", a.SignEncrypt},
	} {
		if !f.set {
			missing = append(missing, f.name)
		}
	}
	if a.Decrypt {
		extra = append(extra, "decrypt")
	}
	if len(missing) == 0 && len(extra) == 0 {
		return nil
	}
	msg := fmt.Sprintf("object attributes %#08x:", tpmpub.AttributeBits(a))
	if len(missing) > 0 {
		msg += " missing " + strings.Join(missing, ", ")
	}
	if len(extra) > 0 {
		msg += " unexpected " + strings.Join(extra, ", ")
	}
	return fmt.Errorf("%s", msg)
}

// AKName returns the TPM name of the AK whose TPMT_PUBLIC is akPublicArea
// (TPM 2.0 Part 1, section 16): TPM_ALG_SHA256 (0x000B) followed by the
// SHA-256 of akPublicArea, 34 bytes. It computes the name itself; a name a
// node claims is never used. This is the name credential activation binds
// the challenge to and a node certificate names after a certified join.
//
// It first checks that the public area is an acceptable AK, as every
// function of this package taking one does; otherwise the error wraps
// [ErrAK]. An AK is an ECC NIST P-256 key with SHA-256 names and the
// ECDSA/SHA-256 scheme; restricted and sign (it signs only structures the
// TPM made, Part 1, section 25.2); fixedTPM, fixedParent and
// sensitiveDataOrigin (the TPM made it and it never leaves the TPM); and
// not decrypt. Its other attributes and authPolicy, which govern who may
// use it in its TPM, are not checked. The AK package tpm derives is one.
func AKName(akPublicArea []byte) ([]byte, error) {
	name, err := akName(akPublicArea)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAK, err)
	}
	return name, nil
}

// AKNameHex is [AKName] as lower-case hex, the form logs and the legacy
// "urn:nodetrust:tpm-ak:" URI SAN (pki.TPMAKURNPrefix) show it in.
func AKNameHex(akPublicArea []byte) (string, error) {
	name, err := AKName(akPublicArea)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(name), nil
}
