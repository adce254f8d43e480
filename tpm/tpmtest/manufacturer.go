package tpmtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2/transport"

	"github.com/nodetrust/nodetrust/tpm"
)

// Manufacturer is a TPM manufacturer's certificate authority for tests: a
// root, or an intermediate under another Manufacturer.
type Manufacturer struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

var serial atomic.Int64

// NewManufacturer makes a CA named name: self-signed when parent is nil,
// else issued by parent.
func NewManufacturer(t testing.TB, name string, parent *Manufacturer) *Manufacturer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Test TPM Manufacturer"}},
		NotBefore:             time.Now().Add(-24 * time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	issuer, signer := tmpl, crypto.Signer(key)
	if parent != nil {
		issuer, signer = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &Manufacturer{Cert: cert, Key: key}
}

// Pool is a pool holding the CA's certificate.
func (m *Manufacturer) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(m.Cert)
	return p
}

// OIDs of the TCG EK Credential Profile.
var (
	OIDTPMManufacturer  = asn1.ObjectIdentifier{2, 23, 133, 2, 1}
	OIDTPMModel         = asn1.ObjectIdentifier{2, 23, 133, 2, 2}
	OIDTPMVersion       = asn1.ObjectIdentifier{2, 23, 133, 2, 3}
	OIDEKCertificateEKU = asn1.ObjectIdentifier{2, 23, 133, 8, 1}
	oidSAN              = asn1.ObjectIdentifier{2, 5, 29, 17}
)

// DefaultTPMAttributes are the TPM attributes an EK certificate's
// subjectAltName carries by default (a Nuvoton part).
var DefaultTPMAttributes = []pkix.AttributeTypeAndValue{
	{Type: OIDTPMManufacturer, Value: "id:4E544300"},
	{Type: OIDTPMModel, Value: "NPCT75x"},
	{Type: OIDTPMVersion, Value: "id:00070002"},
}

// TPMSAN is a subjectAltName extension of one directoryName with attrs, as
// the TCG EK Credential Profile describes it (section 3.2.9).
func TPMSAN(t testing.TB, critical bool, attrs []pkix.AttributeTypeAndValue) pkix.Extension {
	t.Helper()
	var rdns pkix.RDNSequence
	for _, a := range attrs {
		rdns = append(rdns, pkix.RelativeDistinguishedNameSET{a})
	}
	name, err := asn1.Marshal(rdns)
	if err != nil {
		t.Fatal(err)
	}
	value, err := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: 4, IsCompound: true, Bytes: name}})
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: oidSAN, Critical: critical, Value: value}
}

// EKCertOptions vary an EK certificate.
type EKCertOptions struct {
	NotBefore, NotAfter time.Time
	// Extensions replace the TPM subjectAltName when not nil.
	Extensions []pkix.Extension
	DNSNames   []string
}

// EKCert makes an EK certificate for pub as a TPM manufacturer does: empty
// subject, a critical subjectAltName holding the TPM attributes, key usage
// keyEncipherment, tcg-kp-EKCertificate.
func (m *Manufacturer) EKCert(t testing.TB, pub crypto.PublicKey, o EKCertOptions) []byte {
	t.Helper()
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(20 * 365 * 24 * time.Hour)
	}
	if o.Extensions == nil {
		o.Extensions = []pkix.Extension{TPMSAN(t, true, DefaultTPMAttributes)}
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		NotBefore:             o.NotBefore,
		NotAfter:              o.NotAfter,
		KeyUsage:              x509.KeyUsageKeyEncipherment,
		UnknownExtKeyUsage:    []asn1.ObjectIdentifier{OIDEKCertificateEKU},
		BasicConstraintsValid: true,
		ExtraExtensions:       o.Extensions,
		DNSNames:              o.DNSNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, m.Cert, pub, m.Key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// Provision certifies the TPM's EK of kind and writes the certificate at
// kind's NV index, as the TPM's manufacturer does, and returns it (DER).
func (m *Manufacturer) Provision(t testing.TB, tp *tpm.TPM, tr transport.TPM, kind tpm.EKKind) []byte {
	t.Helper()
	ek, err := tp.EK(t.Context(), kind)
	if err != nil {
		t.Fatal(err)
	}
	der := m.EKCert(t, ek.Public, EKCertOptions{})
	WriteNV(t, tr, kind.CertIndex(), der, 0)
	return der
}
