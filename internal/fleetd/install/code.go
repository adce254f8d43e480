package install

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/nodetrust/nodetrust/attest"
)

// CodeSize is the size of an install code: 256 random bits.
const CodeSize = 32

// Code is an install code: the bearer credential of one config release.
// Its String, GoString and LogValue say "[install code]", so that a code
// passed to a logger or a format by mistake shows nothing; [Code.Bearer] is
// the only way to its text.
type Code [CodeSize]byte

// NewCode reads a code from random (crypto/rand.Reader when nil).
func NewCode(random io.Reader) (Code, error) {
	if random == nil {
		random = rand.Reader
	}
	var c Code
	if _, err := io.ReadFull(random, c[:]); err != nil {
		return Code{}, fmt.Errorf("make an install code: %w", err)
	}
	return c, nil
}

// codeTextLen is the length of a code's text: unpadded base64url.
var codeTextLen = base64.RawURLEncoding.EncodedLen(CodeSize)

// ErrMalformedCode is a code text that is not one: 43 characters of
// unpadded base64url.
var ErrMalformedCode = errors.New("install code: not 43 characters of unpadded base64url")

// ParseCode parses a code's text ([Code.Bearer]).
func ParseCode(s string) (Code, error) {
	if len(s) != codeTextLen {
		return Code{}, ErrMalformedCode
	}
	var c Code
	n, err := base64.RawURLEncoding.Strict().Decode(c[:], []byte(s))
	if err != nil || n != CodeSize {
		return Code{}, ErrMalformedCode
	}
	return c, nil
}

// CodeFromSecret is the code a TPM's ActivateCredential released from a
// wrapped code ([WrapCode]).
func CodeFromSecret(secret []byte) (Code, error) {
	if len(secret) != CodeSize {
		return Code{}, fmt.Errorf("install code: the TPM released %d bytes, want %d", len(secret), CodeSize)
	}
	return Code(secret), nil
}

// Bearer is the code's text, as the node sends it in
// "Authorization: Bearer <code>": unpadded base64url. Never log it.
func (c Code) Bearer() string { return base64.RawURLEncoding.EncodeToString(c[:]) }

// String hides the code.
func (c Code) String() string { return "[install code]" }

// GoString hides the code.
func (c Code) GoString() string { return "[install code]" }

// LogValue hides the code from log/slog.
func (c Code) LogValue() slog.Value { return slog.StringValue("[install code]") }

// The HKDF-SHA256 labels of the two values a code derives for one UUID.
const (
	verifierLabel = "nodetrust install-code verifier v1"
	sealLabel     = "nodetrust install-code config key v1"
	sealAAD       = "nodetrust config release v1\x00"
)

// derive returns the code's verifier and sealing key for uuid: HKDF-SHA256
// with the code as the secret and the UUID as the salt, under two labels.
// Neither tells anything of the other or of the code.
func (c Code) derive(uuid, label string) []byte {
	k, err := hkdf.Key(sha256.New, c[:], []byte(uuid), label, 32)
	if err != nil {
		// Only a length over 255 hash blocks fails.
		panic("install: HKDF: " + err.Error())
	}
	return k
}

// verifier is what the store keeps to recognize the code for uuid.
func (c Code) verifier(uuid string) []byte { return c.derive(uuid, verifierLabel) }

// verifies reports, in constant time, whether the code derives want for
// uuid.
func (c Code) verifies(uuid string, want []byte) bool {
	return subtle.ConstantTimeCompare(c.verifier(uuid), want) == 1
}

func (c Code) aead(uuid string) cipher.AEAD {
	b, err := aes.NewCipher(c.derive(uuid, sealLabel))
	if err != nil {
		panic("install: AES-256: " + err.Error())
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		panic("install: GCM: " + err.Error())
	}
	return g
}

// seal encrypts config for uuid with AES-256-GCM under the code's key: a
// random nonce, then the ciphertext, with the UUID as associated data.
func (c Code) seal(uuid string, config []byte, random io.Reader) ([]byte, error) {
	if random == nil {
		random = rand.Reader
	}
	g := c.aead(uuid)
	nonce := make([]byte, g.NonceSize(), g.NonceSize()+len(config)+g.Overhead())
	if _, err := io.ReadFull(random, nonce); err != nil {
		return nil, fmt.Errorf("seal the config: %w", err)
	}
	return g.Seal(nonce, nonce, config, []byte(sealAAD+uuid)), nil
}

// open is the inverse of seal.
func (c Code) open(uuid string, sealed []byte) ([]byte, error) {
	g := c.aead(uuid)
	if len(sealed) < g.NonceSize()+g.Overhead() {
		return nil, errors.New("open the config: sealed config too short")
	}
	out, err := g.Open(nil, sealed[:g.NonceSize()], sealed[g.NonceSize():], []byte(sealAAD+uuid))
	if err != nil {
		return nil, fmt.Errorf("open the config: %w", err)
	}
	return out, nil
}

// Wrapped is an install code wrapped to one TPM: the two halves of
// TPM2_MakeCredential's output, without their size prefixes, as
// tpm.TPM.ActivateCredential takes them.
type Wrapped struct {
	CredentialBlob  []byte
	EncryptedSecret []byte
}

// WrapCode wraps code to the session's TPM: TPM2_MakeCredential to the EK
// whose public area is ekPublicArea, bound to akName, the name of the AK
// the session activated (computed by the control plane, attest.AKName).
// Only that TPM, with that AK loaded, unwraps it (ActivateCredential; then
// [CodeFromSecret]).
func WrapCode(ekPublicArea, akName []byte, code Code) (Wrapped, error) {
	blob, enc, err := attest.SealCredential(ekPublicArea, akName, code[:], nil)
	if err != nil {
		return Wrapped{}, fmt.Errorf("wrap the install code: %w", err)
	}
	return Wrapped{CredentialBlob: blob, EncryptedSecret: enc}, nil
}
