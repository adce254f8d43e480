package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
)

// maxCSRSize caps the CSR DER that [ParseCSR] reads. A P-256 CSR with an
// empty subject is about 150 bytes.
const maxCSRSize = 16 << 10

// CreateCSR returns a PKCS#10 certificate request, DER, with an empty
// subject, signed by the node key. The key must be ECDSA P-256: the server
// chooses every name in the certificate, so the request only proves
// possession of the key.
func CreateCSR(signer crypto.Signer) ([]byte, error) {
	if signer == nil {
		return nil, errors.New("create CSR: no signer")
	}
	if !isP256(signer.Public()) {
		return nil, fmt.Errorf("create CSR: node key is %T, want ECDSA P-256", signer.Public())
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		SignatureAlgorithm: x509.ECDSAWithSHA256,
	}, signer)
	if err != nil {
		return nil, fmt.Errorf("create CSR: %w", err)
	}
	return der, nil
}

// ParseCSR parses a PKCS#10 request, DER, checks its self-signature, and
// refuses any key but ECDSA P-256. The request's subject, SANs and
// extensions are not trusted and must not be copied into a certificate.
func ParseCSR(der []byte) (*x509.CertificateRequest, error) {
	if len(der) == 0 {
		return nil, errors.New("parse CSR: empty")
	}
	if len(der) > maxCSRSize {
		return nil, fmt.Errorf("parse CSR: %d bytes, more than %d", len(der), maxCSRSize)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("parse CSR: %w", err)
	}
	if !isP256(csr.PublicKey) {
		return nil, fmt.Errorf("parse CSR: key is %v %T, want ECDSA P-256", csr.PublicKeyAlgorithm, csr.PublicKey)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("parse CSR: signature: %w", err)
	}
	return csr, nil
}
