package attest_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/nodetrust/nodetrust/attest"
)

func TestSealCredentialRefuses(t *testing.T) {
	ekArea, _ := softRSAEK(t)
	name, err := attest.AKName(newSoftAK(t).publicArea)
	if err != nil {
		t.Fatal(err)
	}
	secret := bytes.Repeat([]byte{7}, 32)
	if blob, enc, err := attest.SealCredential(ekArea, name, secret, nil); err != nil || len(blob) == 0 || len(enc) == 0 {
		t.Fatalf("SealCredential: %d, %d bytes, %v", len(blob), len(enc), err)
	}
	sha1Name := append([]byte{0x00, 0x04}, name[2:]...)
	cases := []struct {
		name           string
		ek, ak, secret []byte
		untrustedEK    bool
	}{
		{"a name of another algorithm", ekArea, sha1Name, secret, false},
		{"a short name", ekArea, name[:20], secret, false},
		{"no secret", ekArea, name, nil, false},
		{"a secret longer than the name's digest", ekArea, name, make([]byte, 33), false},
		{"an AK as the EK", newSoftAK(t).publicArea, name, secret, true},
	}
	for _, c := range cases {
		_, _, err := attest.SealCredential(c.ek, c.ak, c.secret, nil)
		if !errors.Is(err, attest.ErrActivation) || errors.Is(err, attest.ErrUntrustedEK) != c.untrustedEK {
			t.Errorf("%s: %v, want ErrActivation (and ErrUntrustedEK: %v)", c.name, err, c.untrustedEK)
		}
	}
}
