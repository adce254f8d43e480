package attest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// VerifyCertify checks the AK's TPM2_Certify (TPM 2.0 Part 3, section 18.2)
// of a node key, as tpm.TPM.Certify returns it: attest, the TPMS_ATTEST (the
// contents of a TPM2B_ATTEST), signature, the AK's TPMT_SIGNATURE over it,
// and keyPublicArea, the node key's TPMT_PUBLIC; csrSHA256 is the SHA-256 of
// the CSR the node sent, which the node passed as qualifyingData.
//
// It checks that the AK is acceptable ([ErrAK]); that signature is the AK's
// ECDSA/SHA-256 signature over sha256(attest); that attest is a
// TPM_ST_ATTEST_CERTIFY starting with TPM_GENERATED_VALUE; that its
// extraData is csrSHA256 (constant time); that the certified name is the
// name computed here from keyPublicArea (so the TPM that holds the AK holds
// an object with exactly this public area); and that keyPublicArea is a
// node key: an ECC NIST P-256 ECDSA/SHA-256 signing key with SHA-256 names,
// no authPolicy and exactly fixedTPM, fixedParent, sensitiveDataOrigin,
// userWithAuth, noDA and sign (not restricted, not decrypt) — the key
// package tpm derives (tpmpub.CheckNodeKey, shared with the node).
//
// It returns the node key, an *ecdsa.PublicKey: the caller must check that
// it is the CSR's public key, and that the AK is one it proved (by
// credential activation, or the AK the node's certificate names). Errors
// wrap [ErrCertify].
func VerifyCertify(akPublicArea, attest, signature, keyPublicArea []byte, csrSHA256 []byte) (crypto.PublicKey, error) {
	k, err := verifyCertify(akPublicArea, attest, signature, keyPublicArea, csrSHA256)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCertify, err)
	}
	return k, nil
}

func verifyCertify(akPublicArea, attest, signature, keyPublicArea []byte, csrSHA256 []byte) (*ecdsa.PublicKey, error) {
	if len(csrSHA256) != sha256.Size {
		return nil, fmt.Errorf("CSR digest of %d bytes, want a SHA-256 (%d)", len(csrSHA256), sha256.Size)
	}
	a, err := verifyAttest(akPublicArea, attest, signature, tpm2.TPMSTAttestCertify)
	if err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare(a.ExtraData.Buffer, csrSHA256) != 1 {
		return nil, errors.New("the certification's extraData is not the SHA-256 of this CSR")
	}
	info, err := a.Attested.Certify()
	if err != nil {
		return nil, fmt.Errorf("certify info: %w", err)
	}
	key, err := tpmpub.CheckNodeKey(keyPublicArea)
	if err != nil {
		return nil, fmt.Errorf("node key public area: %w", err)
	}
	name := sha256Name(keyPublicArea) // CheckNodeKey: strict, SHA-256 names
	if subtle.ConstantTimeCompare(info.Name.Buffer, name) != 1 {
		return nil, fmt.Errorf("the certification names %x, not the key of this public area (%x)", info.Name.Buffer, name)
	}
	return key, nil
}
