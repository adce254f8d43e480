package attest

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/google/go-tpm/tpm2"
)

// SealCredential seals secret, a value of the verifier's choosing, to the
// TPM whose EK public area is ekPublicArea, bound to the object named
// akName: the verifier's half of TPM2_MakeCredential, as [NewChallenge]
// does for a random secret. The TPM that holds the EK releases secret
// (tpm.TPM.ActivateCredential, given the two outputs as they are) only to
// an object of that name loaded in it.
//
// akName must be a SHA-256 TPM name (TPM_ALG_SHA256 and 32 bytes), one the
// verifier computed itself ([AKName]) from an AK whose activation it
// checked: a name a node claims proves nothing. secret is at most 32 bytes.
// The EK public area is checked as NewChallenge checks it; random is
// crypto/rand.Reader when nil.
//
// Errors wrap [ErrActivation], and [ErrUntrustedEK] for an EK public area
// that is not of a TCG EK template.
func SealCredential(ekPublicArea, akName, secret []byte, random io.Reader) (credentialBlob, encryptedSecret []byte, err error) {
	if random == nil {
		random = rand.Reader
	}
	if len(akName) != 2+sha256.Size || binary.BigEndian.Uint16(akName) != uint16(tpm2.TPMAlgSHA256) {
		return nil, nil, fmt.Errorf("%w: the AK name is not a SHA-256 TPM name", ErrActivation)
	}
	if len(secret) == 0 || len(secret) > sha256.Size {
		return nil, nil, fmt.Errorf("%w: a credential secret is 1 to %d bytes, not %d", ErrActivation, sha256.Size, len(secret))
	}
	_, ekPub, err := parseEK(ekPublicArea)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrActivation, err)
	}
	key, err := tpm2.ImportEncapsulationKey(&ekPub)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: EK public area: %w", ErrActivation, err)
	}
	blob, enc, err := tpm2.CreateCredential(random, key, akName, secret)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: make the credential: %w", ErrActivation, err)
	}
	return blob, enc, nil
}
