package tpm

import (
	"crypto/ecdsa"
	"fmt"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// The templates and checks of the keys this package derives are defined
// once, in package tpmpub, which the verifier (package attest) shares: what
// the node derives and what the verifier accepts cannot drift apart. The
// object attributes (TPMA_OBJECT, Part 2, section 8.3) are
// tpmpub.NodeKeyAttributes and tpmpub.AKAttributes.

func nodeKeyTemplate(unique []byte) tpm2.TPMTPublic { return tpmpub.NodeKeyTemplate(unique) }

func akTemplate(unique []byte) tpm2.TPMTPublic { return tpmpub.AKTemplate(unique) }

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
	if _, err := tpmpub.CheckNodeKey(publicArea); err != nil {
		return fmt.Errorf("node key public area: %w", err)
	}
	return nil
}

// CheckAKAttributes is [CheckNodeKeyAttributes] for an AK as [TPM.NewAK]
// derives it: the same, and restricted.
func CheckAKAttributes(publicArea []byte) error {
	if _, err := tpmpub.CheckAK(publicArea); err != nil {
		return fmt.Errorf("AK public area: %w", err)
	}
	return nil
}

// checkPublicArea parses publicArea, checks it is of want's kind, and returns
// its public key.
func checkPublicArea(publicArea []byte, want tpm2.TPMTPublic) (*ecdsa.PublicKey, error) {
	return tpmpub.Check(publicArea, want)
}

// parsePublicArea unmarshals a TPMT_PUBLIC strictly: the bytes must be
// exactly the marshalling of what they decode to (no trailing data).
func parsePublicArea(b []byte) (tpm2.TPMTPublic, error) { return tpmpub.Parse(b) }

// checkSameKind compares every field of got but the unique field with want.
func checkSameKind(got, want tpm2.TPMTPublic) error { return tpmpub.CheckSameKind(got, want) }
