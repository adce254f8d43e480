package callsig

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"time"
)

// SignerConfig configures [NewSigner].
type SignerConfig struct {
	// Sender is the id the signer's calls give: an instance id, the
	// command line's id or a daemon's id. Required; at most MaxSenderLen
	// bytes.
	Sender string
	// Key is the sender's Ed25519 private key. Required. The Signer keeps
	// it; the caller must not change it afterwards.
	Key ed25519.PrivateKey
	// Now is the clock of timestamps; nil means time.Now.
	Now func() time.Time
	// Rand is the source of nonces; nil means crypto/rand.Reader. Tests
	// may pass a deterministic reader; production code must not.
	Rand io.Reader
}

// Signer signs calls for one sender. It is safe for concurrent use when its
// Rand is (crypto/rand.Reader is).
type Signer struct {
	sender string
	key    ed25519.PrivateKey
	now    func() time.Time
	rand   io.Reader
}

// NewSigner returns a Signer for cfg.Sender with cfg.Key, filling in the
// default clock and randomness.
func NewSigner(cfg SignerConfig) (*Signer, error) {
	if cfg.Sender == "" || len(cfg.Sender) > MaxSenderLen {
		return nil, fmt.Errorf("new signer: sender %s is empty or longer than %d bytes", quote(cfg.Sender), MaxSenderLen)
	}
	if len(cfg.Key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("new signer: key is %d bytes, want an Ed25519 private key of %d", len(cfg.Key), ed25519.PrivateKeySize)
	}
	s := &Signer{sender: cfg.Sender, key: cfg.Key, now: cfg.Now, rand: cfg.Rand}
	if s.now == nil {
		s.now = time.Now
	}
	if s.rand == nil {
		s.rand = rand.Reader
	}
	return s, nil
}

// Sender returns the id the signer's calls give.
func (s *Signer) Sender() string { return s.sender }

// Public returns the signer's public key, the key a daemon stores for its
// sender.
func (s *Signer) Public() ed25519.PublicKey {
	return s.key.Public().(ed25519.PublicKey)
}

// String names the signer's sender; it never shows the key.
func (s *Signer) String() string { return "callsig.Signer{sender=" + quote(s.sender) + "}" }

// Sign returns a signed envelope for one call: the namespace of the
// caller's session, the call's key expression and kind, and its payload,
// with the current time and a fresh random nonce. The envelope refers to
// payload; the caller must not change it before the envelope is marshalled.
// Sign refuses, with an error wrapping [ErrMalformed], a field that is empty
// or over its limit.
func (s *Signer) Sign(namespace, keyExpr, kind string, payload []byte) (*Envelope, error) {
	e := &Envelope{
		Namespace: namespace,
		KeyExpr:   keyExpr,
		Kind:      kind,
		Sender:    s.sender,
		Timestamp: s.now().UnixNano(),
		Payload:   payload,
	}
	if err := e.check(); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	if _, err := io.ReadFull(s.rand, e.Nonce[:]); err != nil {
		return nil, fmt.Errorf("sign: read nonce: %w", err)
	}
	e.Signature = ed25519.Sign(s.key, e.appendSigned(make([]byte, 0, e.signedLen())))
	return e, nil
}
