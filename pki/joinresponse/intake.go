package joinresponse

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki"
)

// IntakeLabel starts the data whose SHA-256 an intake response's
// signature covers: label || 0x00 || payload. It differs from [Label], so
// that a signed join result never opens as an intake result, nor the other
// way round.
const IntakeLabel = "nodetrust intake-response v1"

// IntakeDigest returns SHA-256("nodetrust intake-response v1" || 0x00 ||
// payload).
func IntakeDigest(payload []byte) []byte {
	h := sha256.New()
	h.Write([]byte(IntakeLabel))
	h.Write([]byte{0})
	h.Write(payload)
	return h.Sum(nil)
}

// SignIntake serializes r (deterministic protobuf encoding) and signs it
// with the JoinService signing key as [Sign] does a join result, over
// [IntakeDigest] of the payload.
func SignIntake(signer crypto.Signer, r *joinv1.IntakeResult) (*joinv1.SignedJoinResult, error) {
	if signer == nil || r == nil {
		return nil, errors.New("sign intake result: signer and result are required")
	}
	spki, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		return nil, fmt.Errorf("sign intake result: signing key: %w", err)
	}
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("sign intake result: marshal: %w", err)
	}
	sig, err := pki.SignP1363(signer, IntakeDigest(payload))
	if err != nil {
		return nil, fmt.Errorf("sign intake result: %w", err)
	}
	return &joinv1.SignedJoinResult{Payload: payload, Signature: sig, Kid: pki.PinOfSPKI(spki).String(), SigningKey: spki}, nil
}

// OpenIntake verifies a signed intake result: signing_key's pin and kid
// are signingKeyPin, the signature verifies under it over [IntakeDigest],
// the payload is an IntakeResult, and its csr_sha256 is csrSHA256. The
// certificates in it are the caller's to check (they are device
// certificates, not node certificates). Failures wrap [ErrRefused].
func OpenIntake(s *joinv1.SignedJoinResult, signingKeyPin pki.Pin, csrSHA256 []byte) (*joinv1.IntakeResult, error) {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("open intake response: %s: %w", fmt.Sprintf(format, a...), ErrRefused)
	}
	switch {
	case s == nil:
		return nil, fail("no signed result")
	case signingKeyPin.IsZero():
		return nil, errors.New("open intake response: expected signing key pin is not set")
	case len(csrSHA256) != sha256.Size:
		return nil, fmt.Errorf("open intake response: expected CSR hash is %d bytes, want %d", len(csrSHA256), sha256.Size)
	}
	if got := pki.PinOfSPKI(s.GetSigningKey()); !got.Equal(signingKeyPin) {
		return nil, fail("signing key pin %s is not the trusted join signing key pin %s", got, signingKeyPin)
	}
	if kid, err := pki.ParsePin(s.GetKid()); err != nil || !kid.Equal(signingKeyPin) {
		return nil, fail("kid %s is not the trusted join signing key pin %s", quoteShort(s.GetKid()), signingKeyPin)
	}
	key, err := x509.ParsePKIXPublicKey(s.GetSigningKey())
	if err != nil {
		return nil, fail("signing key: %v", err)
	}
	ek, ok := key.(*ecdsa.PublicKey)
	if !ok {
		return nil, fail("signing key is %T, want ECDSA", key)
	}
	if !pki.VerifyP1363(ek, IntakeDigest(s.GetPayload()), s.GetSignature()) {
		return nil, fail("signature does not verify under the join signing key as an intake response")
	}
	r := new(joinv1.IntakeResult)
	if err := proto.Unmarshal(s.GetPayload(), r); err != nil {
		return nil, fail("payload is not an IntakeResult: %v", err)
	}
	if subtle.ConstantTimeCompare(r.GetCsrSha256(), csrSHA256) != 1 {
		return nil, fail("csr_sha256 is not this request's CSR hash")
	}
	return r, nil
}
