package pki

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hpke"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// JWK "alg" values for the join encryption key.
const (
	JWKAlgP256         = "HPKE-P256-SHA256-A128GCM"
	JWKAlgMLKEM768P256 = "HPKE-MLKEM768P256-SHA256-A128GCM"
)

// maxJWKSize caps the JWK that [ParseJWK] reads; a hybrid key's JWK is
// about 1.8 KB.
const maxJWKSize = 8 << 10

// b64 is unpadded base64url that refuses non-canonical trailing bits.
var b64 = base64.RawURLEncoding.Strict()

// jwkEC is the JWK of a DHKEM(P-256) key; field order is the output order.
type jwkEC struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	Alg string `json:"alg"`
	Use string `json:"use"`
	Kid string `json:"kid"`
}

// jwkAKP is the JWK of a hybrid key ("AKP": algorithm key pair).
type jwkAKP struct {
	Kty string `json:"kty"`
	Alg string `json:"alg"`
	Pub string `json:"pub"`
	Use string `json:"use"`
	Kid string `json:"kid"`
}

// MarshalJWK encodes the public key as a JSON Web Key, the content of
// join-encryption.jwk. For [KEMP256]:
//
//	{"kty":"EC","crv":"P-256","x":…,"y":…,"alg":"HPKE-P256-SHA256-A128GCM","use":"enc","kid":"<pin>"}
//
// and for [KEMMLKEM768P256]:
//
//	{"kty":"AKP","alg":"HPKE-MLKEM768P256-SHA256-A128GCM","pub":"<base64url SerializePublicKey>","use":"enc","kid":"<pin>"}
//
// where <pin> is [JoinEncryptionPublicKey.Pin] in text form.
func (p *JoinEncryptionPublicKey) MarshalJWK() ([]byte, error) {
	var v any
	switch p.kem {
	case KEMP256:
		pt := p.pub.Bytes() // 0x04 || X || Y
		if len(pt) != 65 || pt[0] != 4 {
			return nil, fmt.Errorf("marshal JWK: unexpected P-256 point of %d bytes", len(pt))
		}
		v = jwkEC{Kty: "EC", Crv: "P-256", X: b64.EncodeToString(pt[1:33]), Y: b64.EncodeToString(pt[33:]),
			Alg: JWKAlgP256, Use: "enc", Kid: p.pin.String()}
	case KEMMLKEM768P256:
		v = jwkAKP{Kty: "AKP", Alg: JWKAlgMLKEM768P256, Pub: b64.EncodeToString(p.pub.Bytes()), Use: "enc", Kid: p.pin.String()}
	default:
		return nil, fmt.Errorf("marshal JWK: unknown KEM %q", p.kem)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("marshal JWK: %w", err)
	}
	return b, nil
}

// ParseJWK parses a join encryption public key written by
// [JoinEncryptionPublicKey.MarshalJWK]. It is strict: the JSON must be one
// object whose members are all strings, each named exactly (case matters)
// and at most once, with no members but those of its key type (so a
// private key's "d" is refused). It refuses an unknown kty, crv or alg, a
// "use" other than "enc", base64url that is padded or not canonical,
// coordinates or keys of the wrong length, points not on the curve, and a
// kid that is not the pin computed from the key.
func ParseJWK(b []byte) (*JoinEncryptionPublicKey, error) {
	if len(b) > maxJWKSize {
		return nil, fmt.Errorf("parse JWK: %d bytes, more than %d", len(b), maxJWKSize)
	}
	m, err := jwkMembers(b)
	if err != nil {
		return nil, fmt.Errorf("parse JWK: %w", err)
	}
	var (
		name    string
		allowed []string
		pub     hpke.PublicKey
	)
	switch kty := m["kty"]; kty {
	case "EC":
		name, allowed = KEMP256, []string{"kty", "crv", "x", "y", "alg", "use", "kid"}
	case "AKP":
		name, allowed = KEMMLKEM768P256, []string{"kty", "alg", "pub", "use", "kid"}
	case "":
		return nil, errors.New("parse JWK: no kty")
	default:
		return nil, fmt.Errorf("parse JWK: unknown kty %q (want \"EC\" or \"AKP\")", kty)
	}
	for k := range m {
		if !slices.Contains(allowed, k) {
			return nil, fmt.Errorf("parse JWK: member %q is not allowed in a %s join encryption key", k, m["kty"])
		}
	}
	if u := m["use"]; u != "enc" {
		return nil, fmt.Errorf("parse JWK: use is %q, want \"enc\"", u)
	}
	switch name {
	case KEMP256:
		if crv := m["crv"]; crv != "P-256" {
			return nil, fmt.Errorf("parse JWK: unknown crv %q (want \"P-256\")", crv)
		}
		if alg := m["alg"]; alg != JWKAlgP256 {
			return nil, fmt.Errorf("parse JWK: alg %q is not %q", alg, JWKAlgP256)
		}
		x, err := jwkBytes(m, "x", 32)
		if err != nil {
			return nil, err
		}
		y, err := jwkBytes(m, "y", 32)
		if err != nil {
			return nil, err
		}
		pt := append(append([]byte{4}, x...), y...)
		ek, err := ecdh.P256().NewPublicKey(pt)
		if err != nil {
			return nil, fmt.Errorf("parse JWK: point is not on P-256: %w", err)
		}
		if pub, err = hpke.NewDHKEMPublicKey(ek); err != nil {
			return nil, fmt.Errorf("parse JWK: %w", err)
		}
	case KEMMLKEM768P256:
		if alg := m["alg"]; alg != JWKAlgMLKEM768P256 {
			return nil, fmt.Errorf("parse JWK: alg %q is not %q", alg, JWKAlgMLKEM768P256)
		}
		const size = 1184 + 65 // ML-KEM-768 encapsulation key, P-256 point
		raw, err := jwkBytes(m, "pub", size)
		if err != nil {
			return nil, err
		}
		if pub, err = hpke.MLKEM768P256().NewPublicKey(raw); err != nil {
			return nil, fmt.Errorf("parse JWK: pub is not an ML-KEM-768+P-256 key: %w", err)
		}
	}
	p, err := newJoinEncryptionPublicKey(name, pub)
	if err != nil {
		return nil, fmt.Errorf("parse JWK: %w", err)
	}
	kid, ok := m["kid"]
	if !ok {
		return nil, errors.New("parse JWK: no kid")
	}
	if kid != p.pin.String() {
		return nil, fmt.Errorf("parse JWK: kid %s is not the key's pin %s", quoteShort(kid), p.pin)
	}
	return p, nil
}

// jwkMembers reads one JSON object of string members, refusing duplicate
// names, non-string values and trailing data.
func jwkMembers(b []byte) (map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	m := make(map[string]string)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not JSON: %w", err)
		}
		k, ok := tok.(string)
		if !ok {
			return nil, errors.New("not JSON: member name is not a string")
		}
		tok, err = dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not JSON: %w", err)
		}
		v, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("member %q is not a string", k)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("member %q appears twice", k)
		}
		m[k] = v
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON object")
	}
	return m, nil
}

// jwkBytes decodes the base64url member name, which must be size bytes.
func jwkBytes(m map[string]string, name string, size int) ([]byte, error) {
	s, ok := m[name]
	if !ok {
		return nil, fmt.Errorf("parse JWK: no %q", name)
	}
	b, err := b64.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("parse JWK: %q is not unpadded base64url: %w", name, err)
	}
	if len(b) != size {
		return nil, fmt.Errorf("parse JWK: %q is %d bytes, want %d", name, len(b), size)
	}
	return b, nil
}
