package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestPrivateKeyPEMRoundTrip(t *testing.T) {
	k := mustKey(t)
	b, err := MarshalPrivateKeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("-----BEGIN PRIVATE KEY-----\n")) {
		t.Errorf("PEM does not start with a PKCS#8 block:\n%s", b)
	}
	s, err := ParsePrivateKeyPEM(b)
	if err != nil {
		t.Fatal(err)
	}
	if !k.Equal(s) {
		t.Error("parsed key is not the marshalled key")
	}

	path := filepath.Join(t.TempDir(), "node.key")
	if err := os.WriteFile(path, b, PrivateKeyMode); err != nil {
		t.Fatal(err)
	}
	s, err = ReadPrivateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if !k.Equal(s) {
		t.Error("read key is not the written key")
	}
}

func TestParsePrivateKeyPEMRefuses(t *testing.T) {
	k := mustKey(t)
	sec1, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, want string
		in         []byte
	}{
		{"no PEM at all is refused", "no PEM block", []byte("hello")},
		{"a SEC 1 EC PRIVATE KEY is refused", `"EC PRIVATE KEY", want "PRIVATE KEY"`, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})},
		{"a certificate is refused", `"CERTIFICATE"`, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}})},
		{"garbage in a PKCS#8 block is refused", "parse private key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{0x30, 0}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePrivateKeyPEM(tt.in)
			wantErr(t, err, nil, tt.want)
		})
	}
}

func TestReadErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("nothing"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.key")
	tests := []struct {
		name string
		read func(string) error
		path string
	}{
		{"a missing key file is named", func(p string) error { _, err := ReadPrivateKey(p); return err }, missing},
		{"a malformed key file is named", func(p string) error { _, err := ReadPrivateKey(p); return err }, bad},
		{"a missing certificate file is named", func(p string) error { _, err := ReadCerts(p); return err }, missing},
		{"a malformed certificate file is named", func(p string) error { _, err := ReadCerts(p); return err }, bad},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, tt.read(tt.path), nil, tt.path)
		})
	}
}

func TestCertsPEMRoundTrip(t *testing.T) {
	a, _ := newAuthority(t, "")
	b := EncodeCertsPEM(a.NodeCA, a.Root)
	certs, err := ParseCertsPEM(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != 2 || !certs[0].Equal(a.NodeCA) || !certs[1].Equal(a.Root) {
		t.Errorf("round trip gave %d certificates, not node CA then root", len(certs))
	}
}

func TestParseCertsPEMRefuses(t *testing.T) {
	a, _ := newAuthority(t, "")
	keyPEM, err := MarshalPrivateKeyPEM(mustKey(t))
	if err != nil {
		t.Fatal(err)
	}
	one := EncodeCertsPEM(a.Root)
	tests := []struct {
		name, want string
		in         []byte
	}{
		{"empty input has no certificate", "no PEM certificate", nil},
		{"a private key is not a certificate", `PEM block 2 is "PRIVATE KEY"`, append(append([]byte{}, one...), keyPEM...)},
		{"a truncated last block is refused", "unexpected text after certificate 1", append(append([]byte{}, one...), one[:40]...)},
		{"a corrupt certificate is refused", "parse certificate 1", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{0x30, 1, 0}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCertsPEM(tt.in)
			wantErr(t, err, nil, tt.want)
		})
	}
}

// rawSigner answers in r||s form, as some hardware signers do.
type rawSigner struct{ k *ecdsa.PrivateKey }

func (s rawSigner) Public() crypto.PublicKey { return s.k.Public() }
func (s rawSigner) Sign(r io.Reader, digest []byte, _ crypto.SignerOpts) ([]byte, error) {
	rr, ss, err := ecdsa.Sign(r, s.k, digest)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 64)
	rr.FillBytes(out[:32])
	ss.FillBytes(out[32:])
	return out, nil
}

func TestSignP1363(t *testing.T) {
	k := mustKey(t)
	digest := sha256.Sum256([]byte("message"))
	tests := []struct {
		name   string
		signer crypto.Signer
	}{
		{"an ASN.1 signer is converted", k},
		{"an r||s signer is passed through", rawSigner{k}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sig, err := SignP1363(tt.signer, digest[:])
			if err != nil {
				t.Fatal(err)
			}
			if len(sig) != 64 {
				t.Fatalf("signature is %d bytes, want 64", len(sig))
			}
			if !VerifyP1363(&k.PublicKey, digest[:], sig) {
				t.Error("signature does not verify")
			}
		})
	}
}

func TestVerifyP1363Refuses(t *testing.T) {
	k := mustKey(t)
	digest := sha256.Sum256([]byte("message"))
	sig, err := SignP1363(k, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	asn1Sig, err := k.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(sig)
	flipped[10] ^= 1
	other := sha256.Sum256([]byte("other"))
	tests := []struct {
		name   string
		pub    *ecdsa.PublicKey
		digest []byte
		sig    []byte
	}{
		{"a flipped bit is refused", &k.PublicKey, digest[:], flipped},
		{"another digest is refused", &k.PublicKey, other[:], sig},
		{"another key is refused", &mustKey(t).PublicKey, digest[:], sig},
		{"an ASN.1 signature is refused", &k.PublicKey, digest[:], asn1Sig},
		{"a short signature is refused", &k.PublicKey, digest[:], sig[:63]},
		{"zeros are refused", &k.PublicKey, digest[:], make([]byte, 64)},
		{"no key refuses", nil, digest[:], sig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if VerifyP1363(tt.pub, tt.digest, tt.sig) {
				t.Error("VerifyP1363 accepted")
			}
		})
	}
}

func TestSignP1363Refuses(t *testing.T) {
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, want string
		signer     crypto.Signer
		digest     []byte
	}{
		{"an Ed25519 key is refused", "want ECDSA", ed, make([]byte, 32)},
		{"a short digest is refused", "digest is 20 bytes", mustKey(t), make([]byte, 20)},
		{"no signer is refused", "no signer", nil, make([]byte, 32)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := SignP1363(tt.signer, tt.digest)
			wantErr(t, err, nil, tt.want)
		})
	}
}

func TestCSR(t *testing.T) {
	k := mustKey(t)
	der, err := CreateCSR(k)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := ParseCSR(der)
	if err != nil {
		t.Fatal(err)
	}
	if !k.PublicKey.Equal(csr.PublicKey) {
		t.Error("CSR certifies another key")
	}
	if len(csr.Subject.Names) != 0 || len(csr.DNSNames)+len(csr.URIs)+len(csr.IPAddresses) != 0 {
		t.Errorf("CSR subject %v or SANs are not empty", csr.Subject)
	}
}

func TestCSRRefuses(t *testing.T) {
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("CreateCSR refuses a P-384 key", func(t *testing.T) {
		_, err := CreateCSR(p384)
		wantErr(t, err, nil, "want ECDSA P-256")
	})

	csrOf := func(key crypto.Signer) []byte {
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	good, err := CreateCSR(mustKey(t))
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Clone(good)
	tampered[len(tampered)-5] ^= 1
	tests := []struct {
		name, want string
		der        []byte
	}{
		{"a P-384 key is refused", "want ECDSA P-256", csrOf(p384)},
		{"an Ed25519 key is refused", "want ECDSA P-256", csrOf(ed)},
		{"a bad signature is refused", "signature", tampered},
		{"garbage is refused", "parse CSR", []byte{0x30, 0x03, 1, 2, 3}},
		{"nothing is refused", "empty", nil},
		{"a huge input is refused", "more than", make([]byte, maxCSRSize+1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCSR(tt.der)
			wantErr(t, err, nil, tt.want)
		})
	}
}
