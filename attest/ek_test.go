package attest_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

func TestNewRequiresRoots(t *testing.T) {
	if _, err := attest.New(attest.Config{}); err == nil || !strings.Contains(err.Error(), "Roots") {
		t.Fatalf("New without roots: %v, want an error naming Config.Roots", err)
	}
}

func newVerifier(t testing.TB, roots *tpmtest.Manufacturer, intermediates *tpmtest.Manufacturer, now time.Time) *attest.Verifier {
	t.Helper()
	cfg := attest.Config{Roots: roots.Pool()}
	if intermediates != nil {
		cfg.Intermediates = intermediates.Pool()
	}
	if !now.IsZero() {
		cfg.Now = func() time.Time { return now }
	}
	v, err := attest.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVerifyEKCertificateAccepts(t *testing.T) {
	root := tpmtest.NewManufacturer(t, "Test TPM Root CA", nil)
	inter := tpmtest.NewManufacturer(t, "Test TPM Intermediate CA", root)
	rsaArea, rsaPub := softRSAEK(t)
	eccArea, eccPub := softECCEK(t)

	// The EK public keys come from the public areas, as the server gets
	// them.
	for name, area := range map[string][]byte{"RSA": rsaArea, "ECC": eccArea} {
		pub, err := attest.EKPublic(area)
		if err != nil {
			t.Fatalf("EKPublic(%s): %v", name, err)
		}
		want := map[string]crypto.PublicKey{"RSA": rsaPub, "ECC": eccPub}[name]
		if !want.(interface{ Equal(crypto.PublicKey) bool }).Equal(pub) {
			t.Fatalf("EKPublic(%s) returned another key", name)
		}
	}

	viaRoot := root.EKCert(t, rsaPub, tpmtest.EKCertOptions{})
	viaInter := inter.EKCert(t, eccPub, tpmtest.EKCertOptions{})
	// TCG PC Client Platform TPM Profile, section 7.3.2: an NV header
	// before the certificate, and padding after it.
	header := append([]byte{0x10, 0x01, 0x00}, binary.BigEndian.AppendUint16(nil, uint16(len(viaRoot)))...)
	wrapped := append(append(header, viaRoot...), make([]byte, 100)...)
	padded := append(bytes.Clone(viaInter), 0xFF, 0xFF, 0xFF)
	nonCriticalSAN := root.EKCert(t, rsaPub, tpmtest.EKCertOptions{Extensions: []pkix.Extension{tpmtest.TPMSAN(t, false, tpmtest.DefaultTPMAttributes)}})
	noSAN := root.EKCert(t, rsaPub, tpmtest.EKCertOptions{Extensions: []pkix.Extension{}})
	// A critical SAN with a DNS name is one crypto/x509 handles itself.
	dnsSAN := root.EKCert(t, rsaPub, tpmtest.EKCertOptions{Extensions: []pkix.Extension{}, DNSNames: []string{"tpm.example"}})

	cases := []struct {
		name string
		der  []byte
		pub  crypto.PublicKey
		v    *attest.Verifier
	}{
		{"an RSA EK certificate signed by a root", viaRoot, rsaPub, newVerifier(t, root, nil, time.Time{})},
		{"an ECC EK certificate signed by a configured intermediate", viaInter, eccPub, newVerifier(t, root, inter, time.Time{})},
		{"a certificate behind the TCG NV header, padded", wrapped, rsaPub, newVerifier(t, root, nil, time.Time{})},
		{"a certificate with padding after it", padded, eccPub, newVerifier(t, root, inter, time.Time{})},
		{"a non-critical TPM subjectAltName", nonCriticalSAN, rsaPub, newVerifier(t, root, nil, time.Time{})},
		{"no subjectAltName", noSAN, rsaPub, newVerifier(t, root, nil, time.Time{})},
		{"a subjectAltName crypto/x509 handles", dnsSAN, rsaPub, newVerifier(t, root, nil, time.Time{})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cert, err := tc.v.VerifyEKCertificate(tc.der, tc.pub)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.pub.(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey) {
				t.Fatal("the returned certificate holds another key")
			}
			if len(cert.UnhandledCriticalExtensions) != 0 {
				t.Fatalf("unhandled critical extensions left: %v", cert.UnhandledCriticalExtensions)
			}
		})
	}
}

func TestVerifyEKCertificateRefuses(t *testing.T) {
	root := tpmtest.NewManufacturer(t, "Test TPM Root CA", nil)
	inter := tpmtest.NewManufacturer(t, "Test TPM Intermediate CA", root)
	otherRoot := tpmtest.NewManufacturer(t, "Another Root CA", nil)
	_, rsaPub := softRSAEK(t)
	_, eccPub := softECCEK(t)
	v := newVerifier(t, root, nil, time.Time{})
	good := root.EKCert(t, rsaPub, tpmtest.EKCertOptions{})
	now := time.Now()

	withCN := append(slices.Clone(tpmtest.DefaultTPMAttributes), pkix.AttributeTypeAndValue{Type: oidCommonName, Value: "evil"})
	otherCritical := pkix.Extension{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Critical: true, Value: []byte{0x05, 0x00}}
	emptyDirName := func() pkix.Extension {
		e := tpmtest.TPMSAN(t, true, nil)
		return e
	}()
	// A SAN of a directoryName and a registeredID: crypto/x509 finds no
	// name it knows, and the registeredID is not a TPM attribute.
	mixedSAN := func() pkix.Extension {
		e := tpmtest.TPMSAN(t, true, tpmtest.DefaultTPMAttributes)
		var names []asn1.RawValue
		if _, err := asn1.Unmarshal(e.Value, &names); err != nil {
			t.Fatal(err)
		}
		names = append(names, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 8, Bytes: []byte{0x2a, 0x03}})
		v, err := asn1.Marshal(names)
		if err != nil {
			t.Fatal(err)
		}
		e.Value = v
		return e
	}()

	cases := []struct {
		name   string
		v      *attest.Verifier
		der    []byte
		pub    crypto.PublicKey
		substr string
	}{
		{"a certificate of another manufacturer", newVerifier(t, otherRoot, nil, time.Time{}), good, rsaPub, "unknown authority"},
		{"an intermediate that is not configured", v, inter.EKCert(t, rsaPub, tpmtest.EKCertOptions{}), rsaPub, "unknown authority"},
		{"an expired certificate", v, root.EKCert(t, rsaPub, tpmtest.EKCertOptions{NotAfter: now.Add(-time.Minute)}), rsaPub, "expired"},
		{"a certificate checked after it expired", newVerifier(t, root, nil, now.Add(30*365*24*time.Hour)), good, rsaPub, "expired"},
		{"a certificate not yet valid", v, root.EKCert(t, rsaPub, tpmtest.EKCertOptions{NotBefore: now.Add(time.Hour)}), rsaPub, "expired or is not yet valid"},
		{"a certificate of another key", v, good, eccPub, "another key"},
		{"a critical SAN with a common name", v, root.EKCert(t, rsaPub, tpmtest.EKCertOptions{Extensions: []pkix.Extension{tpmtest.TPMSAN(t, true, withCN)}}), rsaPub, "2.5.4.3"},
		{"a critical SAN with an empty directoryName", v, root.EKCert(t, rsaPub, tpmtest.EKCertOptions{Extensions: []pkix.Extension{emptyDirName}}), rsaPub, "empty directoryName"},
		{"a critical SAN with a registeredID", v, root.EKCert(t, rsaPub, tpmtest.EKCertOptions{Extensions: []pkix.Extension{mixedSAN}}), rsaPub, "tag [8]"},
		{"another unhandled critical extension", v, root.EKCert(t, rsaPub, tpmtest.EKCertOptions{Extensions: []pkix.Extension{tpmtest.TPMSAN(t, true, tpmtest.DefaultTPMAttributes), otherCritical}}), rsaPub, "unhandled critical"},
		{"no certificate", v, nil, rsaPub, "empty"},
		{"garbage", v, []byte("not a certificate"), rsaPub, "parse"},
		{"a truncated certificate", v, good[:len(good)-10], rsaPub, "parse"},
		{"an oversized input", v, append(bytes.Clone(good), make([]byte, attest.MaxEKCertificateSize)...), rsaPub, "more than"},
		{"no EK public key", v, good, nil, "no EK public key"},
		{"a typed nil EK public key", v, good, (*rsa.PublicKey)(nil), "no EK public key"},
		{"an Ed25519 key", v, good, ed25519.PublicKey(make([]byte, 32)), "type ed25519.PublicKey"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cert, err := tc.v.VerifyEKCertificate(tc.der, tc.pub)
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
			if cert != nil {
				t.Fatal("returned a certificate with an error")
			}
			if !errors.Is(err, attest.ErrUntrustedEK) {
				t.Fatalf("error %v does not wrap ErrUntrustedEK", err)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error %q does not mention %q", err, tc.substr)
			}
		})
	}
}

func TestEKPin(t *testing.T) {
	_, rsaPub := softRSAEK(t)
	_, eccPub := softECCEK(t)
	for _, pub := range []crypto.PublicKey{rsaPub, eccPub} {
		got, err := attest.EKPin(pub)
		if err != nil {
			t.Fatal(err)
		}
		want, err := pki.PinOf(pub)
		if err != nil {
			t.Fatal(err)
		}
		if got != want.String() {
			t.Fatalf("EKPin = %s, want pki's %s", got, want)
		}
		if _, err := pki.ParsePin(got); err != nil {
			t.Fatalf("pki.ParsePin(EKPin): %v", err)
		}
	}
	for _, pub := range []crypto.PublicKey{nil, (*ecdsa.PublicKey)(nil), (*rsa.PublicKey)(nil), &ecdsa.PublicKey{}} {
		if _, err := attest.EKPin(pub); !errors.Is(err, attest.ErrUntrustedEK) {
			t.Fatalf("EKPin(%#v): %v, want ErrUntrustedEK", pub, err)
		}
	}
}

// eccEKP384 is the high-range ECC NIST P-384 EK template H-3 with a point.
func eccEKP384(t testing.TB) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := k.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return tpm2.Marshal(tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA384,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true,
			UserWithAuth: true, AdminWithPolicy: true, Restricted: true, Decrypt: true,
		},
		AuthPolicy: tpm2.TPM2BDigest{Buffer: make([]byte, 48)},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{
				Algorithm: tpm2.TPMAlgAES,
				KeyBits:   tpm2.NewTPMUSymKeyBits(tpm2.TPMAlgAES, tpm2.TPMKeyBits(256)),
				Mode:      tpm2.NewTPMUSymMode(tpm2.TPMAlgAES, tpm2.TPMAlgCFB),
			},
			Scheme:  tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
			CurveID: tpm2.TPMECCNistP384,
			KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: raw[1:49]},
			Y: tpm2.TPM2BECCParameter{Buffer: raw[49:]},
		}),
	})
}

func TestEKPublic(t *testing.T) {
	rsaArea, _ := softRSAEK(t)
	eccArea, _ := softECCEK(t)
	p384 := eccEKP384(t)
	for name, area := range map[string][]byte{"RSA 2048 (L-1)": rsaArea, "ECC P-256 (L-2)": eccArea, "ECC P-384 (H-3)": p384} {
		if _, err := attest.EKPublic(area); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}

	mutate := func(area []byte, f func(p *tpm2.TPMTPublic)) []byte {
		p, err := tpm2.Unmarshal[tpm2.TPMTPublic](area)
		if err != nil {
			t.Fatal(err)
		}
		f(p)
		return tpm2.Marshal(p)
	}
	rsaParms := func(f func(r *tpm2.TPMSRSAParms)) func(p *tpm2.TPMTPublic) {
		return func(p *tpm2.TPMTPublic) {
			r, err := p.Parameters.RSADetail()
			if err != nil {
				t.Fatal(err)
			}
			c := *r
			f(&c)
			p.Parameters = tpm2.NewTPMUPublicParms(tpm2.TPMAlgRSA, &c)
		}
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
	cases := []struct {
		name, substr string
		area         []byte
	}{
		{"an empty public area", "empty", nil},
		{"trailing bytes", "trailing", append(bytes.Clone(rsaArea), 0)},
		{"an AK", "attributes", newSoftAK(t).publicArea},
		{"not restricted", "attributes", mutate(rsaArea, func(p *tpm2.TPMTPublic) { p.ObjectAttributes.Restricted = false })},
		{"a signing key", "attributes", mutate(eccArea, func(p *tpm2.TPMTPublic) { p.ObjectAttributes.SignEncrypt = true })},
		{"a key that can leave the TPM", "attributes", mutate(eccArea, func(p *tpm2.TPMTPublic) { p.ObjectAttributes.FixedTPM = false })},
		{"an imported key", "attributes", mutate(rsaArea, func(p *tpm2.TPMTPublic) { p.ObjectAttributes.SensitiveDataOrigin = false })},
		{"RSA with SHA-1 names", "nameAlg", mutate(rsaArea, func(p *tpm2.TPMTPublic) { p.NameAlg = tpm2.TPMAlgSHA1 })},
		{"P-256 with SHA-384 names", "nameAlg", mutate(eccArea, func(p *tpm2.TPMTPublic) { p.NameAlg = tpm2.TPMAlgSHA384 })},
		{"RSA 1024", "bits", mutate(rsaArea, rsaParms(func(r *tpm2.TPMSRSAParms) { r.KeyBits = 1024 }))},
		{"RSA 3072 with SHA-256 names (H-6 has SHA-384)", "nameAlg", mutate(rsaArea, rsaParms(func(r *tpm2.TPMSRSAParms) { r.KeyBits = 3072 }))},
		{"an RSA exponent of 3", "exponent", mutate(rsaArea, rsaParms(func(r *tpm2.TPMSRSAParms) { r.Exponent = 3 }))},
		{"no symmetric algorithm", "symmetric", mutate(rsaArea, rsaParms(func(r *tpm2.TPMSRSAParms) { r.Symmetric = tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull} }))},
		{"AES-256 on P-256", "AES-128", mutate(eccArea, eccParms(func(e *tpm2.TPMSECCParms) {
			e.Symmetric.KeyBits = tpm2.NewTPMUSymKeyBits(tpm2.TPMAlgAES, tpm2.TPMKeyBits(256))
		}))},
		{"a scheme", "scheme", mutate(eccArea, eccParms(func(e *tpm2.TPMSECCParms) {
			e.Scheme = tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgECDH, Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDH, &tpm2.TPMSKeySchemeECDH{HashAlg: tpm2.TPMAlgSHA256})}
		}))},
		{"P-521", "curve", mutate(eccArea, eccParms(func(e *tpm2.TPMSECCParms) { e.CurveID = tpm2.TPMECCNistP521 }))},
		{"a point off the curve", "point", mutate(eccArea, func(p *tpm2.TPMTPublic) {
			p.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
				X: tpm2.TPM2BECCParameter{Buffer: bytes.Repeat([]byte{1}, 32)},
				Y: tpm2.TPM2BECCParameter{Buffer: bytes.Repeat([]byte{2}, 32)},
			})
		})},
		{"an RSA modulus of 1024 bits", "2048", mutate(rsaArea, func(p *tpm2.TPMTPublic) {
			p.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgRSA, &tpm2.TPM2BPublicKeyRSA{Buffer: bytes.Repeat([]byte{0xC3}, 128)})
		})},
		{"a keyed hash", "attributes", tpm2.Marshal(tpm2.TPMTPublic{Type: tpm2.TPMAlgKeyedHash, NameAlg: tpm2.TPMAlgSHA256,
			Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgKeyedHash, &tpm2.TPMSKeyedHashParms{Scheme: tpm2.TPMTKeyedHashScheme{Scheme: tpm2.TPMAlgNull}}),
			Unique:     tpm2.NewTPMUPublicID(tpm2.TPMAlgKeyedHash, &tpm2.TPM2BDigest{})})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := attest.EKPublic(tc.area)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, attest.ErrUntrustedEK) {
				t.Fatalf("error %v does not wrap ErrUntrustedEK", err)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error %q does not mention %q", err, tc.substr)
			}
		})
	}
}

// TestVerifyEKCertificateChainBounds: a chain from the node is bounded in
// count and size, and one certificate that does not parse refuses it.
func TestVerifyEKCertificateChainBounds(t *testing.T) {
	root := tpmtest.NewManufacturer(t, "Test TPM Root CA", nil)
	inter := tpmtest.NewManufacturer(t, "Test TPM Intermediate CA", root)
	_, eccPub := softECCEK(t)
	v := newVerifier(t, root, nil, time.Time{})
	der := inter.EKCert(t, eccPub, tpmtest.EKCertOptions{})
	if _, err := v.VerifyEKCertificateChain(der, [][]byte{inter.Cert.Raw}, eccPub); err != nil {
		t.Fatalf("through the intermediate: %v", err)
	}
	for name, chain := range map[string][][]byte{
		"too many":       slices.Repeat([][]byte{inter.Cert.Raw}, attest.MaxEKChain+1),
		"not a cert":     {inter.Cert.Raw, []byte("not a certificate")},
		"too large":      {make([]byte, attest.MaxEKCertificateSize+1)},
		"no chain, only": nil,
	} {
		if _, err := v.VerifyEKCertificateChain(der, chain, eccPub); !errors.Is(err, attest.ErrUntrustedEK) {
			t.Errorf("%s: %v, want ErrUntrustedEK", name, err)
		}
	}
}
