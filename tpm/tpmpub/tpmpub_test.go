package tpmpub_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// withPoint returns tmpl with a valid P-256 point in its unique field, as
// TPM2_CreatePrimary returns it.
func withPoint(t testing.TB, tmpl tpm2.TPMTPublic) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := k.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	tmpl.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: raw[1:33]},
		Y: tpm2.TPM2BECCParameter{Buffer: raw[33:]},
	})
	return tpm2.Marshal(tmpl)
}

func TestName(t *testing.T) {
	for _, tmpl := range []tpm2.TPMTPublic{tpm2.RSAEKTemplate, tpm2.ECCEKTemplate, tpmpub.AKTemplate(nil), tpm2.RSASRKTemplate} {
		p384 := tmpl
		p384.NameAlg = tpm2.TPMAlgSHA384
		for _, p := range []tpm2.TPMTPublic{tmpl, p384} {
			area := tpm2.Marshal(p)
			got, err := tpmpub.Name(area)
			if err != nil {
				t.Fatal(err)
			}
			want, err := tpm2.ObjectName(&p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Buffer) {
				t.Fatalf("Name = %x, go-tpm's ObjectName = %x", got, want.Buffer)
			}
		}
	}
	bad := tpmpub.AKTemplate(nil)
	bad.NameAlg = tpm2.TPMAlgSM3256
	for name, area := range map[string][]byte{
		"an empty area":    nil,
		"trailing data":    append(tpm2.Marshal(tpm2.ECCEKTemplate), 1),
		"a truncated area": tpm2.Marshal(tpm2.ECCEKTemplate)[:20],
		"an SM3 nameAlg":   tpm2.Marshal(bad),
	} {
		if _, err := tpmpub.Name(area); err == nil {
			t.Errorf("Name of %s succeeded", name)
		}
	}
}

func TestParseP256Signing(t *testing.T) {
	// Any attributes: the caller decides.
	attrs := tpm2.TPMAObject{SignEncrypt: true, Restricted: true, FixedTPM: true}
	pub, key, err := tpmpub.ParseP256Signing(withPoint(t, tpmpub.ECCSigningTemplate(attrs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if pub.ObjectAttributes != attrs || key == nil {
		t.Fatalf("attributes %#x, key %v", tpmpub.AttributeBits(pub.ObjectAttributes), key)
	}
	rsa := tpm2.Marshal(tpm2.RSASRKTemplate)
	ecdh := tpmpub.ECCSigningTemplate(attrs, nil)
	ecdh.Parameters = tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
		Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
		Scheme:    tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
		CurveID:   tpm2.TPMECCNistP256,
		KDF:       tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
	})
	sha1 := tpmpub.ECCSigningTemplate(attrs, nil)
	sha1.NameAlg = tpm2.TPMAlgSHA1
	for _, tc := range []struct {
		name, substr string
		area         []byte
	}{
		{"an RSA key", "type", rsa},
		{"no scheme", "parameters", withPoint(t, ecdh)},
		{"SHA-1 names", "nameAlg", withPoint(t, sha1)},
		{"no point", "point", tpm2.Marshal(tpmpub.ECCSigningTemplate(attrs, nil))},
	} {
		_, _, err := tpmpub.ParseP256Signing(tc.area)
		if err == nil || !strings.Contains(err.Error(), tc.substr) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.substr)
		}
	}
}

func TestCheckKinds(t *testing.T) {
	node := withPoint(t, tpmpub.NodeKeyTemplate(nil))
	ak := withPoint(t, tpmpub.AKTemplate(nil))
	if _, err := tpmpub.CheckNodeKey(node); err != nil {
		t.Fatal(err)
	}
	if _, err := tpmpub.CheckAK(ak); err != nil {
		t.Fatal(err)
	}
	if _, err := tpmpub.CheckNodeKey(ak); err == nil {
		t.Fatal("an AK passes as a node key")
	}
	if _, err := tpmpub.CheckAK(node); err == nil {
		t.Fatal("a node key passes as an AK")
	}
	// Reserved attribute bits count.
	p, err := tpm2.Unmarshal[tpm2.TPMTPublic](node)
	if err != nil {
		t.Fatal(err)
	}
	b := tpm2.Marshal(p)
	b[7] |= 0x01 // bit 0 of TPMA_OBJECT, reserved (after type and nameAlg, 2 bytes each)
	if _, err := tpmpub.CheckNodeKey(b); err == nil {
		t.Fatal("a node key with a reserved attribute bit set passes")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(tpm2.Marshal(tpm2.RSAEKTemplate))
	f.Add(tpm2.Marshal(tpm2.ECCEKTemplate))
	f.Add(withPoint(f, tpmpub.AKTemplate(nil)))
	f.Add([]byte{0x00, 0x23, 0x00, 0x0B})
	f.Fuzz(func(t *testing.T, area []byte) {
		p, err := tpmpub.Parse(area)
		if err != nil {
			return
		}
		// Strict: what parses marshals back to the same bytes, and has a
		// name when its nameAlg is a supported hash.
		if !bytes.Equal(tpm2.Marshal(p), area) {
			t.Fatal("Parse accepted non-canonical bytes")
		}
		_, _ = tpmpub.Name(area)
		_, _ = tpmpub.CheckNodeKey(area)
		_, _, _ = tpmpub.ParseP256Signing(area)
	})
}
