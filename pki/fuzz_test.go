package pki

import (
	"bytes"
	"strings"
	"testing"
)

func FuzzParseJWK(f *testing.F) {
	for _, kem := range kems {
		k, err := GenerateJoinEncryptionKey(kem)
		if err != nil {
			f.Fatal(err)
		}
		b, err := k.Public().MarshalJWK()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte(`{"kty":"EC","kty":"EC"}`))
	f.Add([]byte(`{"kty":"EC","crv":"P-256","x":"","y":"","alg":"HPKE-P256-SHA256-A128GCM","use":"enc","kid":""}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseJWK(b)
		if err != nil {
			return
		}
		// What parses must marshal to a JWK that parses to the same key.
		again, err := p.MarshalJWK()
		if err != nil {
			t.Fatalf("MarshalJWK of a parsed key: %v", err)
		}
		q, err := ParseJWK(again)
		if err != nil {
			t.Fatalf("ParseJWK of a marshalled key: %v", err)
		}
		if !q.Equal(p) || !bytes.Equal(q.Bytes(), p.Bytes()) {
			t.Fatal("round trip changed the key")
		}
	})
}

func FuzzParsePin(f *testing.F) {
	f.Add("sha256:" + strings.Repeat("0123456789abcdef", 4))
	f.Add("sha256:" + strings.Repeat("A", 64))
	f.Add("sha256:")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePin(s)
		if err != nil {
			return
		}
		if p.String() != s {
			t.Fatalf("ParsePin(%q).String() = %q", s, p.String())
		}
		var q Pin
		text, err := p.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		if err := q.UnmarshalText(text); err != nil || q != p {
			t.Fatalf("text round trip: %v", err)
		}
	})
}
