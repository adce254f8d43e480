package pki

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

func TestJWKRoundTrip(t *testing.T) {
	for _, kem := range kems {
		t.Run("a "+kem+" key survives its JWK", func(t *testing.T) {
			k, err := GenerateJoinEncryptionKey(kem)
			if err != nil {
				t.Fatal(err)
			}
			b, err := k.Public().MarshalJWK()
			if err != nil {
				t.Fatal(err)
			}
			pub, err := ParseJWK(b)
			if err != nil {
				t.Fatalf("ParseJWK(%s): %v", b, err)
			}
			if !pub.Equal(k.Public()) || pub.KEM() != kem || !bytes.Equal(pub.Bytes(), k.Public().Bytes()) {
				t.Error("parsed JWK is another key")
			}
			again, err := pub.MarshalJWK()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, b) {
				t.Errorf("JWK changed on a round trip:\n%s\n%s", b, again)
			}
		})
	}
}

func TestJWKFormat(t *testing.T) {
	k, err := GenerateJoinEncryptionKey(KEMP256)
	if err != nil {
		t.Fatal(err)
	}
	b, err := k.Public().MarshalJWK()
	if err != nil {
		t.Fatal(err)
	}
	prefix := `{"kty":"EC","crv":"P-256","x":"`
	suffix := `","alg":"HPKE-P256-SHA256-A128GCM","use":"enc","kid":"` + k.Public().Pin().String() + `"}`
	if !strings.HasPrefix(string(b), prefix) || !strings.HasSuffix(string(b), suffix) {
		t.Errorf("JWK = %s", b)
	}

	h, err := GenerateJoinEncryptionKey(KEMMLKEM768P256)
	if err != nil {
		t.Fatal(err)
	}
	b, err = h.Public().MarshalJWK()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kty":"AKP","alg":"HPKE-MLKEM768P256-SHA256-A128GCM","pub":"` +
		base64.RawURLEncoding.EncodeToString(h.Public().Bytes()) +
		`","use":"enc","kid":"` + h.Public().Pin().String() + `"}`
	if string(b) != want {
		t.Errorf("JWK = %s\nwant  %s", b, want)
	}
}

// editJWK decodes a JWK into a map, applies edit, and encodes it again.
func editJWK(t *testing.T, jwk []byte, edit func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(jwk, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseJWKRefuses(t *testing.T) {
	ec, err := GenerateJoinEncryptionKey(KEMP256)
	if err != nil {
		t.Fatal(err)
	}
	ecJWK, err := ec.Public().MarshalJWK()
	if err != nil {
		t.Fatal(err)
	}
	hy, err := GenerateJoinEncryptionKey(KEMMLKEM768P256)
	if err != nil {
		t.Fatal(err)
	}
	hyJWK, err := hy.Public().MarshalJWK()
	if err != nil {
		t.Fatal(err)
	}
	otherPin := mustPinOf(t, mustKey(t).Public()).String()
	b64 := base64.RawURLEncoding.EncodeToString
	pt := ec.Public().Bytes()
	offCurveY := bytes.Clone(pt[33:])
	offCurveY[31] ^= 1
	hyBad := bytes.Clone(hy.Public().Bytes())
	for i := 0; i < 384; i++ { // ML-KEM coefficients above the modulus
		hyBad[i] = 0xff
	}
	set := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	del := func(k string) func(map[string]any) { return func(m map[string]any) { delete(m, k) } }

	tests := []struct {
		name, want string
		in         []byte
	}{
		{"an unknown kty is refused", `unknown kty "OKP"`, editJWK(t, ecJWK, set("kty", "OKP"))},
		{"a missing kty is refused", "no kty", editJWK(t, ecJWK, del("kty"))},
		{"an unknown crv is refused", `unknown crv "P-384"`, editJWK(t, ecJWK, set("crv", "P-384"))},
		{"an unknown alg is refused", `alg "ECDH-ES"`, editJWK(t, ecJWK, set("alg", "ECDH-ES"))},
		{"the hybrid alg on an EC key is refused", `alg "HPKE-MLKEM768P256-SHA256-A128GCM" is not`, editJWK(t, ecJWK, set("alg", JWKAlgMLKEM768P256))},
		{"the P-256 alg on a hybrid key is refused", `alg "HPKE-P256-SHA256-A128GCM" is not`, editJWK(t, hyJWK, set("alg", JWKAlgP256))},
		{"use sig is refused", `use is "sig"`, editJWK(t, ecJWK, set("use", "sig"))},
		{"a missing use is refused", `use is ""`, editJWK(t, ecJWK, del("use"))},
		{"a missing kid is refused", "no kid", editJWK(t, ecJWK, del("kid"))},
		{"a kid of another key is refused", "is not the key's pin", editJWK(t, ecJWK, set("kid", otherPin))},
		{"a hybrid kid of another key is refused", "is not the key's pin", editJWK(t, hyJWK, set("kid", otherPin))},
		{"a short x is refused", `"x" is 31 bytes`, editJWK(t, ecJWK, set("x", b64(pt[1:32])))},
		{"a long y is refused", `"y" is 33 bytes`, editJWK(t, ecJWK, set("y", b64(append([]byte{0}, pt[33:]...))))},
		{"a padded x is refused", "not unpadded base64url", editJWK(t, ecJWK, set("x", base64.URLEncoding.EncodeToString(pt[1:33])))},
		{"standard base64 is refused", "not unpadded base64url", editJWK(t, ecJWK, set("x", strings.Repeat("+", 43)))},
		{"a point off the curve is refused", "not on P-256", editJWK(t, ecJWK, set("y", b64(offCurveY)))},
		{"a missing x is refused", `no "x"`, editJWK(t, ecJWK, del("x"))},
		{"a short hybrid key is refused", `"pub" is 1248 bytes, want 1249`, editJWK(t, hyJWK, set("pub", b64(hy.Public().Bytes()[:1248])))},
		{"an invalid ML-KEM key is refused", "not an ML-KEM-768+P-256 key", editJWK(t, hyJWK, set("pub", b64(hyBad)))},
		{"a private d member is refused", `member "d" is not allowed`, editJWK(t, ecJWK, set("d", "AAAA"))},
		{"a pub member on an EC key is refused", `member "pub" is not allowed`, editJWK(t, ecJWK, set("pub", "AAAA"))},
		{"an x member on a hybrid key is refused", `member "x" is not allowed`, editJWK(t, hyJWK, set("x", "AAAA"))},
		{"a number value is refused", `member "use" is not a string`, editJWK(t, ecJWK, set("use", 1))},
		{"an upper-case member name is refused", `member "CRV" is not allowed`, []byte(strings.Replace(string(ecJWK), `"crv"`, `"CRV"`, 1))},
		{"a duplicate member is refused", `member "kty" appears twice`, []byte(`{"kty":"EC","kty":"EC"}`)},
		{"trailing data is refused", "data after the JSON object", append(bytes.Clone(ecJWK), []byte(" {}")...)},
		{"an array is refused", "not a JSON object", []byte(`[]`)},
		{"not JSON is refused", "not JSON", []byte(`{"kty":`)},
		{"an empty input is refused", "not JSON", nil},
		{"a huge input is refused", "more than", make([]byte, maxJWKSize+1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseJWK(tt.in)
			wantErr(t, err, nil, tt.want)
		})
	}
}
