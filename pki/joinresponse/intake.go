package joinresponse

import (
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
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
func IntakeDigest(payload []byte) []byte { return labelledDigest(IntakeLabel, payload) }

// SignIntake serializes r (deterministic protobuf encoding) and signs it
// with the JoinService signing key as [Sign] does a join result, over
// [IntakeDigest] of the payload.
func SignIntake(signer crypto.Signer, r *joinv1.IntakeResult) (*joinv1.SignedJoinResult, error) {
	if r == nil {
		return nil, errors.New("sign intake result: signer and result are required")
	}
	return signLabelled(signer, r, IntakeLabel, "intake result")
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
	ek, err := signingKey(s, signingKeyPin, fail)
	if err != nil {
		return nil, err
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
