package pki

import (
	"crypto/ecdh"
	"crypto/hpke"
	"crypto/sha256"
	"encoding/pem"
	"errors"
	"fmt"
)

// Join encryption KEM names, as written in configuration, the PEM "KEM"
// header and [JoinEncryptionPublicKey.KEM].
const (
	// KEMP256 is DHKEM(P-256, HKDF-SHA256), the default.
	KEMP256 = "p256"
	// KEMMLKEM768P256 is the ML-KEM-768 + P-256 hybrid of draft-ietf-hpke-pq
	// (HPKE KEM id 0x0050).
	KEMMLKEM768P256 = "mlkem768-p256"
)

// JoinTokenInfo is the fixed prefix of the HPKE info for join tokens; the
// CSR's SHA-256 follows it.
const JoinTokenInfo = "nodetrust join-token v1"

// pemJoinEncryptionKey is the PEM block type of a join encryption key.
const pemJoinEncryptionKey = "NODETRUST HPKE PRIVATE KEY"

// hybridPinLabel starts the data hashed into a hybrid key's pin.
const hybridPinLabel = "nodetrust hpke-kem 0x0050"

// maxSealedToken caps the sealed token OpenToken reads.
const maxSealedToken = 16 << 10

// kemByName returns the HPKE KEM for a KEM name; "" means KEMP256.
func kemByName(name string) (string, hpke.KEM, error) {
	switch name {
	case "", KEMP256:
		return KEMP256, hpke.DHKEM(ecdh.P256()), nil
	case KEMMLKEM768P256:
		return KEMMLKEM768P256, hpke.MLKEM768P256(), nil
	}
	return "", nil, fmt.Errorf("unknown join encryption KEM %q (want %q or %q)", name, KEMP256, KEMMLKEM768P256)
}

// JoinEncryptionKey is the JoinService's HPKE private key; join tokens are
// sealed to its public key. It is not comparable; keep it out of logs.
type JoinEncryptionKey struct {
	kem  string
	priv hpke.PrivateKey
	pub  *JoinEncryptionPublicKey
}

// JoinEncryptionPublicKey is the public half of a [JoinEncryptionKey], as a
// node reads it from join-encryption.jwk.
type JoinEncryptionPublicKey struct {
	kem string
	pub hpke.PublicKey
	pin Pin
}

// GenerateJoinEncryptionKey returns a new join encryption key for the named
// KEM: [KEMP256] (also for "") or [KEMMLKEM768P256].
func GenerateJoinEncryptionKey(kem string) (*JoinEncryptionKey, error) {
	name, k, err := kemByName(kem)
	if err != nil {
		return nil, fmt.Errorf("generate join encryption key: %w", err)
	}
	priv, err := k.GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("generate join encryption key: %w", err)
	}
	return newJoinEncryptionKey(name, priv)
}

func newJoinEncryptionKey(name string, priv hpke.PrivateKey) (*JoinEncryptionKey, error) {
	pub, err := newJoinEncryptionPublicKey(name, priv.PublicKey())
	if err != nil {
		return nil, err
	}
	return &JoinEncryptionKey{kem: name, priv: priv, pub: pub}, nil
}

func newJoinEncryptionPublicKey(name string, pub hpke.PublicKey) (*JoinEncryptionPublicKey, error) {
	p := &JoinEncryptionPublicKey{kem: name, pub: pub}
	switch name {
	case KEMP256:
		ek, err := ecdh.P256().NewPublicKey(pub.Bytes())
		if err != nil {
			return nil, fmt.Errorf("join encryption public key: %w", err)
		}
		if p.pin, err = PinOf(ek); err != nil {
			return nil, fmt.Errorf("join encryption public key: %w", err)
		}
	case KEMMLKEM768P256:
		h := sha256.New()
		h.Write([]byte(hybridPinLabel))
		h.Write([]byte{0})
		h.Write(pub.Bytes())
		h.Sum(p.pin[:0])
	default:
		return nil, fmt.Errorf("join encryption public key: unknown KEM %q", name)
	}
	return p, nil
}

// KEM returns the key's KEM name.
func (k *JoinEncryptionKey) KEM() string { return k.kem }

// Public returns the public key.
func (k *JoinEncryptionKey) Public() *JoinEncryptionPublicKey { return k.pub }

// MarshalPEM encodes the private key as a PEM block of type
// "NODETRUST HPKE PRIVATE KEY" with the header "KEM: <name>". The bytes are
// RFC 9180 SerializePrivateKey for DHKEM(P-256) (the 32-byte scalar) and the
// 32-byte seed for the hybrid, both as KEM.NewPrivateKey reads them back.
// The caller writes it with mode [PrivateKeyMode].
func (k *JoinEncryptionKey) MarshalPEM() ([]byte, error) {
	b, err := k.priv.Bytes()
	if err != nil {
		return nil, fmt.Errorf("marshal join encryption key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{
		Type:    pemJoinEncryptionKey,
		Headers: map[string]string{"KEM": k.kem},
		Bytes:   b,
	}), nil
}

// ParseJoinEncryptionKeyPEM parses what [JoinEncryptionKey.MarshalPEM]
// wrote. The KEM header is required.
func ParseJoinEncryptionKeyPEM(b []byte) (*JoinEncryptionKey, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("parse join encryption key: no PEM block")
	}
	if block.Type != pemJoinEncryptionKey {
		return nil, fmt.Errorf("parse join encryption key: PEM block is %q, want %q", block.Type, pemJoinEncryptionKey)
	}
	kem, ok := block.Headers["KEM"]
	if !ok || kem == "" {
		return nil, errors.New("parse join encryption key: no KEM header")
	}
	name, k, err := kemByName(kem)
	if err != nil {
		return nil, fmt.Errorf("parse join encryption key: %w", err)
	}
	priv, err := k.NewPrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse join encryption key (%s): %w", name, err)
	}
	return newJoinEncryptionKey(name, priv)
}

// KEM returns the key's KEM name, [KEMP256] or [KEMMLKEM768P256].
func (p *JoinEncryptionPublicKey) KEM() string { return p.kem }

// Pin returns the key's pin, the join_encryption_key_pin. For [KEMP256] it
// is the pin of the key's SubjectPublicKeyInfo (the DER that
// x509.MarshalPKIXPublicKey makes of the *ecdh.PublicKey). For
// [KEMMLKEM768P256], which has no SubjectPublicKeyInfo, it is SHA-256 over
// the ASCII bytes "nodetrust hpke-kem 0x0050", one zero byte, and the
// key's RFC 9180 SerializePublicKey output (the ML-KEM-768 encapsulation
// key followed by the uncompressed P-256 point, 1249 bytes).
func (p *JoinEncryptionPublicKey) Pin() Pin { return p.pin }

// Bytes returns the key's RFC 9180 SerializePublicKey output.
func (p *JoinEncryptionPublicKey) Bytes() []byte { return p.pub.Bytes() }

// Equal reports whether p and q are the same key of the same KEM.
func (p *JoinEncryptionPublicKey) Equal(q *JoinEncryptionPublicKey) bool {
	return p != nil && q != nil && p.kem == q.kem && p.pin.Equal(q.pin)
}

// joinTokenInfo returns the HPKE info for a CSR hash.
func joinTokenInfo(csrSHA256 []byte) ([]byte, error) {
	if len(csrSHA256) != sha256.Size {
		return nil, fmt.Errorf("CSR hash is %d bytes, want %d", len(csrSHA256), sha256.Size)
	}
	info := make([]byte, 0, len(JoinTokenInfo)+sha256.Size)
	info = append(info, JoinTokenInfo...)
	return append(info, csrSHA256...), nil
}

// SealToken seals a join token to the join encryption key with HPKE base
// mode (HKDF-SHA256, AES-128-GCM, the key's KEM) and the info
// "nodetrust join-token v1" || csrSHA256, so it opens only for that CSR.
// csrSHA256 must be the 32-byte SHA-256 of the CSR DER. The result is the
// encapsulated key followed by the ciphertext.
func SealToken(pub *JoinEncryptionPublicKey, csrSHA256, token []byte) ([]byte, error) {
	if pub == nil {
		return nil, errors.New("seal join token: no join encryption key")
	}
	if len(token) == 0 {
		return nil, errors.New("seal join token: token is empty")
	}
	info, err := joinTokenInfo(csrSHA256)
	if err != nil {
		return nil, fmt.Errorf("seal join token: %w", err)
	}
	sealed, err := hpke.Seal(pub.pub, hpke.HKDFSHA256(), hpke.AES128GCM(), info, token)
	if err != nil {
		return nil, fmt.Errorf("seal join token: %w", err)
	}
	return sealed, nil
}

// OpenToken opens a token sealed by [SealToken] for the CSR whose SHA-256
// is csrSHA256. A token sealed to another key, for another CSR, or altered
// gives an error wrapping [ErrOpen]. The token is a secret: the caller
// compares its hash in constant time and never logs it.
func (k *JoinEncryptionKey) OpenToken(csrSHA256, sealed []byte) ([]byte, error) {
	info, err := joinTokenInfo(csrSHA256)
	if err != nil {
		return nil, fmt.Errorf("open join token: %w", err)
	}
	if len(sealed) > maxSealedToken {
		return nil, fmt.Errorf("open join token: %d bytes, more than %d: %w", len(sealed), maxSealedToken, ErrOpen)
	}
	token, err := hpke.Open(k.priv, hpke.HKDFSHA256(), hpke.AES128GCM(), info, sealed)
	if err != nil {
		return nil, fmt.Errorf("open join token: %w: %w", ErrOpen, err)
	}
	return token, nil
}
