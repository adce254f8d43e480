package tpm_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm"
)

// nodeKeyPublic builds, with go-tpm alone, the TPMT_PUBLIC a TPM returns for
// a node key with a valid P-256 point.
func nodeKeyPublic(t testing.TB, restricted bool) tpm2.TPMTPublic {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := k.PublicKey.Bytes() // 0x04 || X || Y
	if err != nil {
		t.Fatal(err)
	}
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true,
			UserWithAuth: true, NoDA: true, SignEncrypt: true, Restricted: restricted,
		},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme: tpm2.TPMTECCScheme{
				Scheme:  tpm2.TPMAlgECDSA,
				Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
			},
			CurveID: tpm2.TPMECCNistP256,
			KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: raw[1:33]},
			Y: tpm2.TPM2BECCParameter{Buffer: raw[33:]},
		}),
	}
}

func TestCheckNodeKeyAttributesAccepts(t *testing.T) {
	if err := tpm.CheckNodeKeyAttributes(tpm2.Marshal(nodeKeyPublic(t, false))); err != nil {
		t.Fatal(err)
	}
	if err := tpm.CheckAKAttributes(tpm2.Marshal(nodeKeyPublic(t, true))); err != nil {
		t.Fatal(err)
	}
}

func TestCheckNodeKeyAttributesRefuses(t *testing.T) {
	mutate := func(f func(p *tpm2.TPMTPublic)) []byte {
		p := nodeKeyPublic(t, false)
		f(&p)
		return tpm2.Marshal(p)
	}
	eccParms := func(f func(e *tpm2.TPMSECCParms)) func(p *tpm2.TPMTPublic) {
		return func(p *tpm2.TPMTPublic) {
			e, err := p.Parameters.ECCDetail()
			if err != nil {
				t.Fatal(err)
			}
			c := *e
			f(&c)
			p.Parameters = tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &c)
		}
	}
	good := tpm2.Marshal(nodeKeyPublic(t, false))
	cases := []struct {
		name   string
		area   []byte
		substr string
	}{
		{"an empty public area", nil, "empty"},
		{"trailing bytes", append(good, 0), "trailing"},
		{"a truncated public area", good[:len(good)-3], "malformed"},
		{"a restricted key (an AK)", mutate(func(p *tpm2.TPMTPublic) { p.ObjectAttributes.Restricted = true }), "attributes"},
		{"a decrypt key", mutate(func(p *tpm2.TPMTPublic) { p.ObjectAttributes.Decrypt = true }), "attributes"},
		{"a key that can leave the TPM", mutate(func(p *tpm2.TPMTPublic) { p.ObjectAttributes.FixedTPM = false }), "attributes"},
		{"an imported key", mutate(func(p *tpm2.TPMTPublic) { p.ObjectAttributes.SensitiveDataOrigin = false }), "attributes"},
		{"a key subject to lockout", mutate(func(p *tpm2.TPMTPublic) { p.ObjectAttributes.NoDA = false }), "attributes"},
		{"a key with an admin policy", mutate(func(p *tpm2.TPMTPublic) { p.ObjectAttributes.AdminWithPolicy = true }), "attributes"},
		{"a key with an authPolicy", mutate(func(p *tpm2.TPMTPublic) { p.AuthPolicy.Buffer = make([]byte, 32) }), "authPolicy"},
		{"SHA-1 names", mutate(func(p *tpm2.TPMTPublic) { p.NameAlg = tpm2.TPMAlgSHA1 }), "nameAlg"},
		{"another curve", mutate(eccParms(func(e *tpm2.TPMSECCParms) { e.CurveID = tpm2.TPMECCNistP384 })), "curve"},
		{"no signing scheme", mutate(eccParms(func(e *tpm2.TPMSECCParms) { e.Scheme = tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull} })), "parameters"},
		{"a point off the curve", mutate(func(p *tpm2.TPMTPublic) {
			p.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
				X: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
				Y: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
			})
		}), "point"},
		{"an RSA key", tpm2.Marshal(tpm2.RSASRKTemplate), "type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tpm.CheckNodeKeyAttributes(tc.area)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error %q does not mention %q", err, tc.substr)
			}
		})
	}
	t.Run("a node key is not an AK", func(t *testing.T) {
		if err := tpm.CheckAKAttributes(good); err == nil {
			t.Fatal("accepted")
		}
	})
}

func FuzzCheckNodeKeyAttributes(f *testing.F) {
	f.Add(tpm2.Marshal(nodeKeyPublic(f, false)))
	f.Add(tpm2.Marshal(nodeKeyPublic(f, true)))
	f.Add(tpm2.Marshal(tpm2.RSAEKTemplate))
	f.Add([]byte{0x00, 0x23, 0x00, 0x0B})
	f.Fuzz(func(t *testing.T, area []byte) {
		// No panic; and what is accepted is exactly one of the two kinds.
		nodeErr := tpm.CheckNodeKeyAttributes(area)
		akErr := tpm.CheckAKAttributes(area)
		if nodeErr == nil && akErr == nil {
			t.Fatal("a public area passes as both a node key and an AK")
		}
	})
}
