package pki

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"strings"
	"testing"
)

func TestParsePin(t *testing.T) {
	good := "sha256:" + strings.Repeat("0123456789abcdef", 4)
	p, err := ParsePin(good)
	if err != nil {
		t.Fatalf("ParsePin(%q): %v", good, err)
	}
	if p.String() != good {
		t.Errorf("String() = %q, want %q", p.String(), good)
	}
	if p.IsZero() {
		t.Error("IsZero() = true for a parsed pin")
	}
}

func TestParsePinRefuses(t *testing.T) {
	hex64 := strings.Repeat("ab", 32)
	tests := []struct {
		name, in, want string
	}{
		{"an empty string has no prefix", "", `missing "sha256:" prefix`},
		{"bare hex has no prefix", hex64, `missing "sha256:" prefix`},
		{"an upper-case prefix is not the prefix", "SHA256:" + hex64, `missing "sha256:" prefix`},
		{"another algorithm is not the prefix", "sha384:" + hex64, `missing "sha256:" prefix`},
		{"63 digits are too few", "sha256:" + hex64[1:], "want 64 hex digits after \"sha256:\", have 63"},
		{"65 digits are too many", "sha256:" + hex64 + "a", "have 65"},
		{"no digits are too few", "sha256:", "have 0"},
		{"upper-case hex is refused", "sha256:" + strings.ToUpper(hex64), "must be lower case"},
		{"a non-hex letter is refused", "sha256:" + hex64[:10] + "g" + hex64[11:], `'g' at offset 17 is not a hex digit`},
		{"a space is refused", "sha256:" + hex64[:63] + " ", "is not a hex digit"},
		{"the all-zero pin is refused", "sha256:" + strings.Repeat("0", 64), "all zero"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePin(tt.in)
			wantErr(t, err, nil, tt.want)
		})
	}
}

func TestPinOfAndPinOfCertAgree(t *testing.T) {
	a, _ := newAuthority(t, "")
	leaf := issueLeaf(t, a.Issuer, mustKey(t), "n1", "worker", "", nil)
	tests := []struct {
		name string
		cert *x509.Certificate
	}{
		{"the root agrees", a.Root},
		{"the node CA agrees", a.NodeCA},
		{"the serving CA agrees", a.ServingCA},
		{"a node leaf agrees", leaf},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, want := PinOfCert(tt.cert), mustPinOf(t, tt.cert.PublicKey)
			if got != want {
				t.Errorf("PinOfCert %s != PinOf %s", got, want)
			}
			if raw := Pin(sha256.Sum256(tt.cert.RawSubjectPublicKeyInfo)); got != raw {
				t.Errorf("PinOfCert %s is not the SPKI hash %s", got, raw)
			}
		})
	}
}

func TestPinOfECDHEqualsPinOfECDSA(t *testing.T) {
	k := mustKey(t)
	ek, err := k.PublicKey.ECDH()
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustPinOf(t, &k.PublicKey), mustPinOf(t, ek); a != b {
		t.Errorf("ECDSA pin %s != ECDH pin %s", a, b)
	}
}

func TestPinOfRefusesUnknownKeys(t *testing.T) {
	_, err := PinOf(struct{}{})
	wantErr(t, err, nil, "pin of struct {}")
}

func TestPinText(t *testing.T) {
	p := mustPinOf(t, mustKey(t).Public())
	b, err := json.Marshal(map[string]Pin{"pin": p})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"pin":"` + p.String() + `"}`; string(b) != want {
		t.Errorf("json = %s, want %s", b, want)
	}
	var back map[string]Pin
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back["pin"] != p {
		t.Errorf("round trip = %s, want %s", back["pin"], p)
	}
	if _, err := (Pin{}).MarshalText(); err == nil {
		t.Error("MarshalText of the zero pin succeeded")
	}
	var q Pin
	wantErr(t, q.UnmarshalText([]byte("sha256:xyz")), nil, "want 64 hex digits")
}

func TestPinEqual(t *testing.T) {
	p := mustPinOf(t, mustKey(t).Public())
	q := mustPinOf(t, mustKey(t).Public())
	tests := []struct {
		name string
		a, b Pin
		want bool
	}{
		{"a pin equals itself", p, p, true},
		{"two keys' pins differ", p, q, false},
		{"a zero pin equals nothing", Pin{}, p, false},
		{"two zero pins are not equal", Pin{}, Pin{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a.Equal(tt.b); got != tt.want {
				t.Errorf("Equal = %v, want %v", got, tt.want)
			}
		})
	}
}

func mustPinOf(tb testing.TB, pub any) Pin {
	tb.Helper()
	p, err := PinOf(pub)
	if err != nil {
		tb.Fatalf("PinOf: %v", err)
	}
	return p
}
