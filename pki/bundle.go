package pki

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Bundle is pki-bundle.json: what an install script needs to trust the
// control plane. It holds no secret.
type Bundle struct {
	TrustDomain          string `json:"trust_domain"`
	ServerName           string `json:"server_name"`
	ServingCASPKIPin     Pin    `json:"serving_ca_spki_pin"`
	JoinSigningKeyPin    Pin    `json:"join_signing_key_pin"`
	JoinEncryptionKeyPin Pin    `json:"join_encryption_key_pin"`
}

// maxBundleSize caps the bundle file ReadBundle reads.
const maxBundleSize = 64 << 10

// ReadBundle reads and checks a pki-bundle.json: a valid trust domain and
// server name, and all three pins present and well formed. Unknown members
// are ignored, so later versions may add some. Errors name the file.
func ReadBundle(path string) (*Bundle, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	b, err := ParseBundle(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}

// ParseBundle parses and checks the content of a pki-bundle.json, as
// [ReadBundle] does.
func ParseBundle(data []byte) (*Bundle, error) {
	if len(data) > maxBundleSize {
		return nil, fmt.Errorf("parse bundle: %d bytes, more than %d", len(data), maxBundleSize)
	}
	// Pins are read as strings first so that an error names the member.
	var raw struct {
		TrustDomain          string `json:"trust_domain"`
		ServerName           string `json:"server_name"`
		ServingCASPKIPin     string `json:"serving_ca_spki_pin"`
		JoinSigningKeyPin    string `json:"join_signing_key_pin"`
		JoinEncryptionKeyPin string `json:"join_encryption_key_pin"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("parse bundle: %w", err)
	}
	b := Bundle{TrustDomain: raw.TrustDomain, ServerName: raw.ServerName}
	for _, p := range []struct {
		name string
		text string
		pin  *Pin
	}{
		{"serving_ca_spki_pin", raw.ServingCASPKIPin, &b.ServingCASPKIPin},
		{"join_signing_key_pin", raw.JoinSigningKeyPin, &b.JoinSigningKeyPin},
		{"join_encryption_key_pin", raw.JoinEncryptionKeyPin, &b.JoinEncryptionKeyPin},
	} {
		if p.text == "" {
			return nil, fmt.Errorf("parse bundle: %s is missing", p.name)
		}
		pin, err := ParsePin(p.text)
		if err != nil {
			return nil, fmt.Errorf("parse bundle: %s: %w", p.name, err)
		}
		*p.pin = pin
	}
	if err := b.Check(); err != nil {
		return nil, fmt.Errorf("parse bundle: %w", err)
	}
	return &b, nil
}

// Check reports the first missing or invalid field, by its JSON name.
func (b *Bundle) Check() error {
	if err := ValidTrustDomain(b.TrustDomain); err != nil {
		return fmt.Errorf("trust_domain: %w", err)
	}
	if b.ServerName == "" {
		return errors.New("server_name is missing")
	}
	if err := validServerName(b.ServerName); err != nil {
		return fmt.Errorf("server_name: %w", err)
	}
	for _, p := range []struct {
		name string
		pin  Pin
	}{
		{"serving_ca_spki_pin", b.ServingCASPKIPin},
		{"join_signing_key_pin", b.JoinSigningKeyPin},
		{"join_encryption_key_pin", b.JoinEncryptionKeyPin},
	} {
		if p.pin.IsZero() {
			return fmt.Errorf("%s is missing", p.name)
		}
	}
	return nil
}
