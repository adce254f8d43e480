package attest_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

func TestVerifyCertifyAccepts(t *testing.T) {
	ak := newSoftAK(t)
	key := newSoftKey(t, tpmpub.NodeKeyAttributes)
	csr := sha256.Sum256([]byte("a CSR"))
	a, sig := ak.certify(t, key.name(t), csr[:])
	pub, err := attest.VerifyCertify(ak.publicArea, a, sig, key.publicArea, csr[:])
	if err != nil {
		t.Fatal(err)
	}
	if !key.priv.PublicKey.Equal(pub) {
		t.Fatal("VerifyCertify returned another key than the certified one")
	}
	if _, ok := pub.(*ecdsa.PublicKey); !ok {
		t.Fatalf("VerifyCertify returned a %T, want *ecdsa.PublicKey", pub)
	}
}

func TestVerifyCertifyRefuses(t *testing.T) {
	ak := newSoftAK(t)
	other := newSoftAK(t)
	key := newSoftKey(t, tpmpub.NodeKeyAttributes)
	key2 := newSoftKey(t, tpmpub.NodeKeyAttributes)
	csr := sha256.Sum256([]byte("a CSR"))
	a, sig := ak.certify(t, key.name(t), csr[:])

	type input struct{ ak, attest, sig, key, csr []byte }
	good := input{ak.publicArea, a, sig, key.publicArea, csr[:]}
	with := func(f func(in *input)) input {
		in := good
		f(&in)
		return in
	}
	type tcase struct {
		name, substr string
		in           input
		isAK         bool
	}
	cases := []tcase{
		{name: "another CSR's digest", substr: "extraData", in: with(func(in *input) { d := sha256.Sum256([]byte("another CSR")); in.csr = d[:] })},
		{name: "a CSR digest that is not SHA-256", substr: "CSR digest of 20 bytes", in: with(func(in *input) { in.csr = csr[:20] })},
		{name: "no CSR digest", substr: "CSR digest of 0 bytes", in: with(func(in *input) { in.csr = nil })},
		{name: "another key's public area", substr: "names", in: with(func(in *input) { in.key = key2.publicArea })},
		{name: "a signature by another AK", substr: "not the AK's", in: with(func(in *input) { in.sig = other.sign(t, a) })},
		{name: "another AK's public area", substr: "not the AK's", in: with(func(in *input) { in.ak = other.publicArea })},
		{name: "a tampered attestation", substr: "not the AK's", in: with(func(in *input) { in.attest = bytes.Clone(a); in.attest[20] ^= 1 })},
		{name: "an empty key public area", substr: "empty", in: with(func(in *input) { in.key = nil })},
		{name: "the AK as the certified key", substr: "attributes", in: func() input {
			a, s := ak.certify(t, ak.name(t), csr[:])
			return input{ak.publicArea, a, s, ak.publicArea, csr[:]}
		}()},
		{name: "a quote signed by the AK", substr: "type", in: func() input {
			a, s := ak.quote(t, csr[:], zeroPCRs())
			return input{ak.publicArea, a, s, key.publicArea, csr[:]}
		}()},
		{name: "a node key as AK", substr: "AK public area", isAK: true, in: func() input {
			a, s := key2.certify(t, key.name(t), csr[:])
			return input{key2.publicArea, a, s, key.publicArea, csr[:]}
		}()},
	}
	for _, tc := range []struct {
		name  string
		attrs func(a *tpm2.TPMAObject)
	}{
		{"a restricted key", func(a *tpm2.TPMAObject) { a.Restricted = true }},
		{"a decrypting key", func(a *tpm2.TPMAObject) { a.Decrypt = true }},
		{"a key that can leave the TPM", func(a *tpm2.TPMAObject) { a.FixedTPM = false }},
		{"a duplicable key", func(a *tpm2.TPMAObject) { a.FixedParent = false }},
		{"an imported key", func(a *tpm2.TPMAObject) { a.SensitiveDataOrigin = false }},
		{"a key subject to lockout", func(a *tpm2.TPMAObject) { a.NoDA = false }},
		{"a key used by policy only", func(a *tpm2.TPMAObject) { a.UserWithAuth = false }},
	} {
		attrs := tpmpub.NodeKeyAttributes
		tc.attrs(&attrs)
		k := newSoftKey(t, attrs)
		a, s := ak.certify(t, k.name(t), csr[:])
		cases = append(cases, tcase{name: tc.name, substr: "attributes", in: input{ak.publicArea, a, s, k.publicArea, csr[:]}})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := attest.VerifyCertify(tc.in.ak, tc.in.attest, tc.in.sig, tc.in.key, tc.in.csr)
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
			if pub != nil {
				t.Fatal("returned a key with an error")
			}
			if !errors.Is(err, attest.ErrCertify) {
				t.Fatalf("error %v does not wrap ErrCertify", err)
			}
			if errors.Is(err, attest.ErrAK) != tc.isAK {
				t.Fatalf("error %v: errors.Is(err, ErrAK) = %v, want %v", err, !tc.isAK, tc.isAK)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error %q does not mention %q", err, tc.substr)
			}
		})
	}
}

// countingReader is a deterministic "random" source that counts the bytes
// read from it.
type countingReader struct{ n int }

func (r *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r.n + i)
	}
	r.n += len(p)
	return len(p), nil
}

func TestNewChallenge(t *testing.T) {
	ak := newSoftAK(t)
	rsaArea, _ := softRSAEK(t)
	eccArea, _ := softECCEK(t)
	for name, ek := range map[string][]byte{"RSA 2048": rsaArea, "ECC P-256": eccArea, "ECC P-384": eccEKP384(t)} {
		t.Run(name, func(t *testing.T) {
			c, err := attest.NewChallenge(ek, ak.publicArea, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Secret) != attest.SecretSize || len(c.CredentialBlob) == 0 || len(c.EncryptedSecret) == 0 {
				t.Fatalf("challenge with a %d-byte secret, %d-byte blob, %d-byte encrypted secret", len(c.Secret), len(c.CredentialBlob), len(c.EncryptedSecret))
			}
			if !bytes.Equal(c.AKName, ak.name(t)) {
				t.Fatalf("challenge bound to %x, want the AK's name %x", c.AKName, ak.name(t))
			}
			if err := c.Check(c.Secret); err != nil {
				t.Fatal(err)
			}
			c2, err := attest.NewChallenge(ek, ak.publicArea, nil)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(c.Secret, c2.Secret) || bytes.Equal(c.EncryptedSecret, c2.EncryptedSecret) {
				t.Fatal("two challenges share a secret")
			}
			if err := c2.Check(c.Secret); !errors.Is(err, attest.ErrActivation) {
				t.Fatalf("another challenge's secret: %v, want ErrActivation", err)
			}
		})
	}
	t.Run("the secret comes from rand", func(t *testing.T) {
		r := &countingReader{}
		c, err := attest.NewChallenge(eccArea, ak.publicArea, r)
		if err != nil {
			t.Fatal(err)
		}
		// (Since Go 1.26 the ephemeral keys of the encapsulation come from
		// the system's generator whatever rand says; the secret does not.)
		if c.Secret[0] != 0 || c.Secret[31] != 31 || r.n < attest.SecretSize {
			t.Fatalf("secret %x after %d bytes read", c.Secret, r.n)
		}
	})
}

func TestNewChallengeRefuses(t *testing.T) {
	ak := newSoftAK(t)
	ek, _ := softRSAEK(t)
	node := newSoftKey(t, tpmpub.NodeKeyAttributes)
	cases := []struct {
		name, substr string
		ek, ak       []byte
		rand         io.Reader
		is           error
	}{
		{"a node key as AK", "missing restricted", ek, node.publicArea, nil, attest.ErrAK},
		{"no AK", "empty", ek, nil, nil, attest.ErrAK},
		{"an EK as AK", "type", ek, ek, nil, attest.ErrAK},
		{"an AK as EK", "EK public area", ak.publicArea, ak.publicArea, nil, attest.ErrUntrustedEK},
		{"no EK", "EK public area", nil, ak.publicArea, nil, attest.ErrUntrustedEK},
		{"a failing random source", "secret", ek, ak.publicArea, strings.NewReader("short"), attest.ErrActivation},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := attest.NewChallenge(tc.ek, tc.ak, tc.rand)
			if err == nil {
				t.Fatal("made a challenge")
			}
			t.Log(err)
			if c != nil {
				t.Fatal("returned a challenge with an error")
			}
			if !errors.Is(err, attest.ErrActivation) || !errors.Is(err, tc.is) {
				t.Fatalf("error %v does not wrap ErrActivation and %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error %q does not mention %q", err, tc.substr)
			}
		})
	}
}

func TestChallengeCheck(t *testing.T) {
	ek, _ := softECCEK(t)
	c, err := attest.NewChallenge(ek, newSoftAK(t).publicArea, nil)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(c.Secret)
	flipped[31] ^= 1
	for name, answer := range map[string][]byte{
		"a wrong answer":     flipped,
		"a truncated answer": c.Secret[:31],
		"a longer answer":    append(bytes.Clone(c.Secret), 0),
		"no answer":          nil,
	} {
		if err := c.Check(answer); !errors.Is(err, attest.ErrActivation) {
			t.Errorf("%s: %v, want ErrActivation", name, err)
		}
	}
	var empty *attest.Challenge
	if err := empty.Check(nil); !errors.Is(err, attest.ErrActivation) {
		t.Errorf("nil challenge: %v, want ErrActivation", err)
	}
	if err := (&attest.Challenge{}).Check(nil); !errors.Is(err, attest.ErrActivation) {
		t.Errorf("empty challenge with an empty answer: %v, want ErrActivation", err)
	}
}
