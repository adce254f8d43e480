package attest

import (
	"crypto/rand"
	"crypto/subtle"
	"fmt"
	"io"

	"github.com/google/go-tpm/tpm2"
)

// SecretSize is the size of a challenge's secret.
const SecretSize = 32

// Challenge is a credential-activation challenge (TPM 2.0 Part 1, section 24
// "Credential Protection"; the verifier's half of TPM2_MakeCredential): a
// random secret sealed to one EK and bound to one AK name.
//
// Send CredentialBlob and EncryptedSecret to the node, which runs
// TPM2_ActivateCredential (tpm.TPM.ActivateCredential takes them as they
// are); keep Secret on the verifier and check the node's answer with
// [Challenge.Check]. The TPM that holds the EK releases the secret only to an
// object of AKName loaded in the same TPM, so a right answer proves that the
// AK whose public area the challenge was made from sits in the EK's TPM.
//
// A challenge is for one answer: the caller keeps it for one session, with a
// deadline, and discards it after the first Check, right or wrong.
type Challenge struct {
	// Secret is the SecretSize random bytes the credential protects.
	// Never send it, never log it.
	Secret []byte
	// CredentialBlob is the contents of the TPM2B_ID_OBJECT (Part 2,
	// section 12.4.3), without its 2-byte size, as go-tpm's
	// tpm2.CreateCredential returns it.
	CredentialBlob []byte
	// EncryptedSecret is the contents of the TPM2B_ENCRYPTED_SECRET (Part
	// 2, section 11.4.33), the seed encrypted to the EK, without its
	// 2-byte size.
	EncryptedSecret []byte
	// AKName is the AK name the credential is bound to, computed by
	// [AKName] from the AK public area.
	AKName []byte
}

// NewChallenge makes a challenge for the AK whose public area is
// akPublicArea in the TPM whose EK public area is ekPublicArea, with a
// secret read from random (crypto/rand.Reader when nil).
//
// It checks both public areas first: the EK must be of a TCG EK template
// ([EKPublic]) and the AK acceptable ([AKName]); the AK's name is computed
// here, never taken from the node. The caller must also establish that it
// trusts this EK — [Verifier.VerifyEKCertificate] with [EKPublic] of the
// same ekPublicArea, or an [EKPin] it holds — or the answer proves only that
// the AK sits in some TPM.
//
// It uses go-tpm's tpm2.CreateCredential. go-attestation's
// ActivationParameters are not used: they check the AK's TPM2_Create
// creation attestation, which an AK made with TPM2_CreatePrimary, as
// nodetrust's is, does not have.
//
// Errors wrap [ErrActivation], and [ErrUntrustedEK] or [ErrAK] for the
// public area at fault.
func NewChallenge(ekPublicArea, akPublicArea []byte, random io.Reader) (*Challenge, error) {
	if random == nil {
		random = rand.Reader
	}
	name, err := akName(akPublicArea)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrActivation, err)
	}
	_, ekPub, err := parseEK(ekPublicArea)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrActivation, err)
	}
	key, err := tpm2.ImportEncapsulationKey(&ekPub)
	if err != nil {
		return nil, fmt.Errorf("%w: EK public area: %w", ErrActivation, err)
	}
	secret := make([]byte, SecretSize)
	if _, err := io.ReadFull(random, secret); err != nil {
		return nil, fmt.Errorf("%w: read the challenge secret: %w", ErrActivation, err)
	}
	blob, encSecret, err := tpm2.CreateCredential(random, key, name, secret)
	if err != nil {
		return nil, fmt.Errorf("%w: make the credential: %w", ErrActivation, err)
	}
	return &Challenge{Secret: secret, CredentialBlob: blob, EncryptedSecret: encSecret, AKName: name}, nil
}

// Check compares answer, the secret the node's TPM released, with the
// challenge's, in constant time. It returns nil when they are equal, and an
// error wrapping [ErrActivation] otherwise.
func (c *Challenge) Check(answer []byte) error {
	if c == nil || len(c.Secret) != SecretSize {
		return fmt.Errorf("%w: no challenge secret to check the answer against", ErrActivation)
	}
	if subtle.ConstantTimeCompare(answer, c.Secret) != 1 {
		return fmt.Errorf("%w: the answer is not the challenge's secret", ErrActivation)
	}
	return nil
}
