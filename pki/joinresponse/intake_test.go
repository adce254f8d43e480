package joinresponse

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki"
)

func TestIntakeResponsesOpenOnlyAsIntakeResponses(t *testing.T) {
	a := newAuthority(t)
	req := newNodeRequest(t)
	pin, err := pki.PinOf(a.JoinSigner.Public())
	if err != nil {
		t.Fatal(err)
	}
	res := &joinv1.IntakeResult{CsrSha256: req.csrHash, Device: "web-01", SessionId: "s1"}
	signed, err := SignIntake(a.JoinSigner, res)
	if err != nil {
		t.Fatal(err)
	}
	got, err := OpenIntake(signed, pin, req.csrHash)
	if err != nil || !proto.Equal(got, res) {
		t.Fatalf("OpenIntake = %v, %v; want %v", got, err, res)
	}

	other := newNodeRequest(t)
	otherKey, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	otherPin, _ := pki.PinOf(otherKey.Public())
	// A join result signed as a join response, carrying the same bytes.
	asJoin, err := Sign(a.JoinSigner, &joinv1.JoinResult{CsrSha256: req.csrHash})
	if err != nil {
		t.Fatal(err)
	}
	tampered := proto.Clone(signed).(*joinv1.SignedJoinResult)
	tampered.Payload = append(tampered.Payload, 0x2a, 0x01, 'x')
	for name, tc := range map[string]struct {
		s    *joinv1.SignedJoinResult
		pin  pki.Pin
		hash []byte
	}{
		"another CSR":                     {signed, pin, other.csrHash},
		"another pin":                     {signed, otherPin, req.csrHash},
		"a join response":                 {asJoin, pin, req.csrHash},
		"a payload changed after signing": {tampered, pin, req.csrHash},
	} {
		if _, err := OpenIntake(tc.s, tc.pin, tc.hash); !errors.Is(err, ErrRefused) {
			t.Errorf("%s: OpenIntake error %v, want ErrRefused", name, err)
		}
	}
	// Nor does an intake response open as a join response.
	if _, err := Open(signed, Expect{SigningKeyPin: pin, CSRSHA256: req.csrHash, PublicKey: req.key.Public()}); !errors.Is(err, ErrRefused) {
		t.Errorf("Open(an intake response) error %v, want ErrRefused", err)
	}
}
