package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// PEM block types.
const (
	pemPrivateKey  = "PRIVATE KEY"
	pemCertificate = "CERTIFICATE"
)

// Permissions of the files this package writes.
const (
	// PrivateKeyMode is the mode of every private key file.
	PrivateKeyMode os.FileMode = 0o600
	// PublicFileMode is the mode of certificates, the JWK and the bundle.
	PublicFileMode os.FileMode = 0o644
)

// GenerateKey returns a new ECDSA P-256 key, the only kind of key nodetrust
// makes for signing and for node identities.
func GenerateKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate P-256 key: %w", err)
	}
	return k, nil
}

// MarshalPrivateKeyPEM encodes a private key as one PKCS#8 PEM block of
// type "PRIVATE KEY". The caller writes it with mode [PrivateKeyMode].
func MarshalPrivateKeyPEM(key crypto.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// ParsePrivateKeyPEM parses the first PEM block of b, which must be a PKCS#8
// "PRIVATE KEY" holding a key that can sign (ECDSA, Ed25519 or RSA).
// Other block types, such as "EC PRIVATE KEY", are refused.
func ParsePrivateKeyPEM(b []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("parse private key: no PEM block")
	}
	if block.Type != pemPrivateKey {
		return nil, fmt.Errorf("parse private key: PEM block is %q, want %q (PKCS#8)", block.Type, pemPrivateKey)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	s, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("parse private key: %T cannot sign", key)
	}
	return s, nil
}

// ReadPrivateKey reads a PKCS#8 PEM private key file. Errors name the file.
func ReadPrivateKey(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read private key: %w", err)
	}
	s, err := ParsePrivateKeyPEM(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// EncodeCertsPEM encodes certificates as consecutive "CERTIFICATE" PEM
// blocks, in the order given (leaf first for a chain).
func EncodeCertsPEM(certs ...*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		// pem.Encode into a bytes.Buffer cannot fail.
		_ = pem.Encode(&buf, &pem.Block{Type: pemCertificate, Bytes: c.Raw})
	}
	return buf.Bytes()
}

// ParseCertsPEM parses every PEM block of b as a certificate, in order.
// It refuses input with no certificate, any block of another type, and
// non-blank text after the last block.
func ParseCertsPEM(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := b
	for {
		block, r := pem.Decode(rest)
		if block == nil {
			break
		}
		rest = r
		if block.Type != pemCertificate {
			return nil, fmt.Errorf("parse certificates: PEM block %d is %q, want %q", len(certs)+1, block.Type, pemCertificate)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("parse certificates: no PEM certificate")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("parse certificates: unexpected text after certificate %d", len(certs))
	}
	return certs, nil
}

// ReadCerts reads a PEM certificate file (one certificate or a chain, leaf
// first). Errors name the file.
func ReadCerts(path string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read certificates: %w", err)
	}
	certs, err := ParseCertsPEM(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return certs, nil
}

// isP256 reports whether pub is an ECDSA P-256 public key.
func isP256(pub crypto.PublicKey) bool {
	k, ok := pub.(*ecdsa.PublicKey)
	return ok && k != nil && k.Curve == elliptic.P256()
}

// publicKeysEqual reports whether a and b are the same public key.
func publicKeysEqual(a, b crypto.PublicKey) bool {
	if a == nil || b == nil {
		return false
	}
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}
