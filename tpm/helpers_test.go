package tpm_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// These checks play the verifier's part, with go-tpm's unmarshalling and the
// standard library, to show that what package tpm returns is what a verifier
// needs. The real verifier lives elsewhere.

// checkAttestSignature verifies sig, a marshalled TPMT_SIGNATURE, over
// attest with the AK's public key.
func checkAttestSignature(t *testing.T, ak *tpm.AK, attest, sig []byte) {
	t.Helper()
	s, err := tpm2.Unmarshal[tpm2.TPMTSignature](sig)
	if err != nil {
		t.Fatalf("unmarshal TPMT_SIGNATURE: %v", err)
	}
	if s.SigAlg != tpm2.TPMAlgECDSA {
		t.Fatalf("signature algorithm %#x, want ECDSA", s.SigAlg)
	}
	e, err := s.Signature.ECDSA()
	if err != nil {
		t.Fatal(err)
	}
	if e.Hash != tpm2.TPMAlgSHA256 {
		t.Fatalf("signature hash %#x, want SHA-256", e.Hash)
	}
	digest := sha256.Sum256(attest)
	r, ss := new(big.Int).SetBytes(e.SignatureR.Buffer), new(big.Int).SetBytes(e.SignatureS.Buffer)
	if !ecdsa.Verify(ak.Public().(*ecdsa.PublicKey), digest[:], r, ss) {
		t.Fatal("the AK's signature over the attestation does not verify")
	}
}

// parseAttest unmarshals a TPMS_ATTEST and checks its type and extraData.
func parseAttest(t *testing.T, attest []byte, typ tpm2.TPMST, extraData []byte) *tpm2.TPMSAttest {
	t.Helper()
	a, err := tpm2.Unmarshal[tpm2.TPMSAttest](attest)
	if err != nil {
		t.Fatalf("unmarshal TPMS_ATTEST: %v", err)
	}
	if a.Magic != tpm2.TPMGeneratedValue {
		t.Fatalf("magic %#x, want TPM_GENERATED_VALUE", a.Magic)
	}
	if a.Type != typ {
		t.Fatalf("attestation type %#x, want %#x", a.Type, typ)
	}
	if !bytes.Equal(a.ExtraData.Buffer, extraData) {
		t.Fatalf("extraData %x, want %x", a.ExtraData.Buffer, extraData)
	}
	return a
}

// checkCertify runs TPM2_Certify of key by ak over sha256(csr) and checks
// the result as a verifier would.
func checkCertify(t *testing.T, tp *tpm.TPM, ak *tpm.AK, key *tpm.Key) {
	t.Helper()
	csr := makeCSR(t, key)
	qd := sha256.Sum256(csr)
	attest, sig, err := tp.Certify(context.Background(), ak, key, qd[:])
	if err != nil {
		t.Fatal(err)
	}
	a := parseAttest(t, attest, tpm2.TPMSTAttestCertify, qd[:])
	info, err := a.Attested.Certify()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(info.Name.Buffer, key.Name()) {
		t.Fatalf("the certification names %x, want the node key's %x", info.Name.Buffer, key.Name())
	}
	// The name is nameAlg || H(public area): the certification covers the
	// public area the node key reports, so its public key too.
	h := sha256.Sum256(key.PublicArea())
	if !bytes.Equal(key.Name(), append([]byte{0x00, 0x0B}, h[:]...)) {
		t.Fatalf("name %x is not SHA-256 of the public area", key.Name())
	}
	checkAttestSignature(t, ak, attest, sig)
}

// checkQuote quotes BootPCRs and checks the quote as a verifier would.
func checkQuote(t *testing.T, tp *tpm.TPM, ak *tpm.AK) map[int][]byte {
	t.Helper()
	nonce := randomBytes(t, 32)
	quoted, sig, pcrs, err := tp.Quote(context.Background(), ak, nonce, tpm.BootPCRs)
	if err != nil {
		t.Fatal(err)
	}
	a := parseAttest(t, quoted, tpm2.TPMSTAttestQuote, nonce)
	info, err := a.Attested.Quote()
	if err != nil {
		t.Fatal(err)
	}
	sel := info.PCRSelect.PCRSelections
	if len(sel) != 1 || sel[0].Hash != tpm2.TPMAlgSHA256 || !bytes.Equal(sel[0].PCRSelect, []byte{0xFF, 0, 0}) {
		t.Fatalf("quoted selection %+v, want SHA-256 PCRs 0-7", sel)
	}
	if len(pcrs) != 8 {
		t.Fatalf("%d PCR values, want 8", len(pcrs))
	}
	h := sha256.New()
	for i := range 8 {
		if len(pcrs[i]) != 32 {
			t.Fatalf("PCR %d: %d bytes", i, len(pcrs[i]))
		}
		h.Write(pcrs[i])
	}
	if !bytes.Equal(h.Sum(nil), info.PCRDigest.Buffer) {
		t.Fatal("the quote's pcrDigest does not match the PCR values returned")
	}
	checkAttestSignature(t, ak, quoted, sig)
	return pcrs
}

// checkActivation makes a challenge for ek and ak's name in pure Go, as the
// verifier does, and has the TPM activate it.
func checkActivation(t *testing.T, tp *tpm.TPM, ak *tpm.AK, ek *tpm.EK) {
	t.Helper()
	secret := randomBytes(t, 32)
	blob, encSecret, err := tpmtest.MakeCredential(ek.PublicArea, ak.Name(), secret)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tp.ActivateCredential(context.Background(), ak, ek, blob, encSecret)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, secret) {
		t.Fatalf("activated %x, want %x", got, secret)
	}
}

// checkSigner signs with key as a crypto.Signer, directly, through a CSR and
// through a TLS handshake.
func checkSigner(t *testing.T, key *tpm.Key) {
	t.Helper()
	pub := key.Public().(*ecdsa.PublicKey)
	digest := sha256.Sum256([]byte("node statement"))
	sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(pub, digest[:], sig) {
		t.Fatal("signature does not verify with ecdsa.VerifyASN1")
	}
	if _, err := key.Sign(rand.Reader, digest[:], crypto.SHA384); err == nil {
		t.Fatal("signing with SHA-384 options succeeded, want an error")
	}

	csr, err := x509.ParseCertificateRequest(makeCSR(t, key))
	if err != nil {
		t.Fatal(err)
	}
	if err := csr.CheckSignature(); err != nil {
		t.Fatalf("CSR signature: %v", err)
	}
	if !pub.Equal(csr.PublicKey) {
		t.Fatal("the CSR holds another public key")
	}
	checkTLS(t, key)
}

func makeCSR(t *testing.T, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "node-1"},
	}, key)
	if err != nil {
		t.Fatalf("CSR with the TPM key: %v", err)
	}
	return der
}

// checkTLS runs a TLS 1.3 handshake in which the server proves possession of
// key, with a self-signed certificate the key signed.
func checkTLS(t *testing.T, key *tpm.Key) {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "node-1"},
		DNSNames:     []string{"node-1"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatalf("self-signed certificate with the TPM key: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	srv := tls.Server(s, &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		MinVersion:   tls.VersionTLS13,
	})
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	cli := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: "node-1", MinVersion: tls.VersionTLS13})
	if err := cli.Handshake(); err != nil {
		t.Fatalf("TLS handshake with the TPM key: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("TLS server handshake with the TPM key: %v", err)
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
