package ekroots_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/ekroots"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

func writePEM(t *testing.T, path string, certs ...*x509.Certificate) {
	t.Helper()
	var b []byte
	for _, c := range certs {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// expiredCA makes a self-signed CA whose validity ended yesterday.
func expiredCA(t *testing.T) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "Old Vendor Root"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLoad builds a bundle as an operator does — a vendor's root and its
// intermediate in separate files, another vendor's root and intermediate
// in one PEM, a DER root, a README — and checks the classification, then
// adds each mistake the check must name.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	rootA := tpmtest.NewManufacturer(t, "Vendor A Root", nil)
	interA := tpmtest.NewManufacturer(t, "Vendor A EK CA", rootA)
	rootB := tpmtest.NewManufacturer(t, "Vendor B Root", nil)
	interB := tpmtest.NewManufacturer(t, "Vendor B EK CA", rootB)
	rootC := tpmtest.NewManufacturer(t, "Vendor C Root", nil)
	writePEM(t, filepath.Join(dir, "vendor-a-root.pem"), rootA.Cert)
	writePEM(t, filepath.Join(dir, "vendor-a-ek-ca.crt"), interA.Cert)
	writePEM(t, filepath.Join(dir, "vendor-b.pem"), rootB.Cert, interB.Cert)
	if err := os.WriteFile(filepath.Join(dir, "vendor-c-root.der"), rootC.Cert.Raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("where each came from"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := ekroots.Load(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Problems) != 0 {
		t.Fatalf("problems in a good bundle: %+v", b.Problems)
	}
	kinds := map[string]ekroots.Kind{}
	for _, e := range b.Entries {
		kinds[e.Subject] = e.Kind
	}
	for subject, want := range map[string]ekroots.Kind{
		rootA.Cert.Subject.String(): ekroots.Root, interA.Cert.Subject.String(): ekroots.Intermediate,
		rootB.Cert.Subject.String(): ekroots.Root, interB.Cert.Subject.String(): ekroots.Intermediate,
		rootC.Cert.Subject.String(): ekroots.Root,
	} {
		if kinds[subject] != want {
			t.Errorf("%s: %q, want %q", subject, kinds[subject], want)
		}
	}
	if len(b.Skipped) != 1 || b.Skipped[0] != "README" {
		t.Errorf("skipped %v, want README", b.Skipped)
	}
	// The pools verify an EK certificate of vendor A through its
	// intermediate.
	_, ek := mustKey(t)
	ekCert, err := x509.ParseCertificate(interA.EKCert(t, ek, tpmtest.EKCertOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	ekCert.UnhandledCriticalExtensions = nil // the TPM SAN: attest handles it
	if _, err := ekCert.Verify(x509.VerifyOptions{Roots: b.Roots(), Intermediates: b.Intermediates(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("an EK certificate of vendor A through the bundle: %v", err)
	}

	// The mistakes.
	orphan := tpmtest.NewManufacturer(t, "Vendor D EK CA", tpmtest.NewManufacturer(t, "Vendor D Root", nil))
	writePEM(t, filepath.Join(dir, "copy-of-a.pem"), rootA.Cert)
	writePEM(t, filepath.Join(dir, "old.pem"), expiredCA(t))
	writePEM(t, filepath.Join(dir, "ek.pem"), ekCert)
	writePEM(t, filepath.Join(dir, "vendor-d-ek-ca.pem"), orphan.Cert)
	if err := os.WriteFile(filepath.Join(dir, "broken.pem"), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err = ekroots.Load(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		isErr bool
		says  string
	}{
		"vendor-a-root.pem":  {false, "also in copy-of-a.pem"},
		"old.pem":            {true, "expired"},
		"ek.pem":             {true, "not a CA certificate"},
		"vendor-d-ek-ca.pem": {false, "is not in the bundle"},
		"broken.pem":         {true, "PEM block 1"},
	}
	for _, p := range b.Problems {
		w, ok := want[p.File]
		if !ok {
			t.Errorf("unexpected problem: %+v", p)
			continue
		}
		if p.Error != w.isErr || !strings.Contains(p.Message, w.says) {
			t.Errorf("%s: %+v, want error=%v saying %q", p.File, p, w.isErr, w.says)
		}
		delete(want, p.File)
	}
	for f := range want {
		t.Errorf("%s: no problem named", f)
	}
	if !b.HasErrors() || b.Errors() == nil {
		t.Error("a bundle with errors reports none")
	}
}

// TestLoadEmpty: a folder without a certificate file is an error.
func TestLoadEmpty(t *testing.T) {
	if _, err := ekroots.Load(t.TempDir(), time.Now()); err == nil || !strings.Contains(err.Error(), "no certificate file") {
		t.Fatalf("empty folder: %v", err)
	}
}

func mustKey(t *testing.T) (*ecdsa.PrivateKey, *ecdsa.PublicKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k, &k.PublicKey
}
