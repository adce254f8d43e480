package localapi

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// KeyPEMType is the PEM block type of a key file: a PKCS#8 Ed25519 private
// key.
const KeyPEMType = "PRIVATE KEY"

// MarshalKey returns the content of a key file for key: one PEM block
// "PRIVATE KEY" holding the PKCS#8 encoding of the Ed25519 private key.
func MarshalKey(key ed25519.PrivateKey) ([]byte, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("encode key: %d bytes, not an Ed25519 private key", len(key))
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: KeyPEMType, Bytes: der}), nil
}

// ParseKey decodes the content of a key file.
func ParseKey(data []byte) (ed25519.PrivateKey, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != KeyPEMType {
		return nil, fmt.Errorf("not a PEM %q block", KeyPEMType)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("data after the PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse PKCS#8: %w", err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("the key is a %T, not Ed25519", k)
	}
	return ek, nil
}

// ReadKeyFile reads the Ed25519 key of a key file. It refuses a file that
// others than its owner may read (mode bits 0077), since another user could
// then act as its sender.
func ReadKeyFile(path string) (ed25519.PrivateKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read key file: %w; run as the user of the daemon", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read key file %s: %w", path, err)
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("key file %s has mode %04o: others than its owner may have read it; remove it (the daemon makes a new one) or chmod 600 it", path, m)
	}
	if fi.Size() > 64<<10 {
		return nil, fmt.Errorf("key file %s: %d bytes, not a key file", path, fi.Size())
	}
	data := make([]byte, fi.Size())
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, fmt.Errorf("read key file %s: %w", path, err)
	}
	k, err := ParseKey(data)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return k, nil
}
