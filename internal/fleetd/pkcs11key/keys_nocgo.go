//go:build !cgo

package pkcs11key

import (
	"crypto"
	"fmt"

	"github.com/nodetrust/nodetrust/pki"
)

// Keys stands in for the PKCS#11 binding in a build without cgo: it opens
// and makes nothing, and says so with [ErrNoCgo].
type Keys struct{ cfg Config }

// New returns a Keys that refuses every key.
func New(cfg Config) *Keys {
	cfg.defaults()
	return &Keys{cfg: cfg}
}

// Close does nothing.
func (k *Keys) Close() error { return nil }

// Open refuses: the key lives in a token this build cannot reach. (The
// caller's error names the key and its reference.)
func (k *Keys) Open(use pki.KeyUse, ref string) (crypto.Signer, error) {
	return nil, ErrNoCgo
}

// Generate refuses: this build cannot reach a token.
func (k *Keys) Generate(u *URI, label string) (*pki.ExternalKey, error) {
	return nil, fmt.Errorf("make key %q in %s: %w", label, u.TokenString(), ErrNoCgo)
}
