package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const goodPin = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadBCD(t *testing.T) {
	p := writeFile(t, `server = "fleet.example:8443"
serving_ca_spki_pin = "`+goodPin+`"
join_signing_key_pin = "`+goodPin+`"
join_encryption_key_pin = "`+goodPin+`"
`)
	c, err := LoadBCD(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.ServerName != "fleet.example" || c.DataDir != DefaultBCDDataDir || c.Pins.ServingCA.String() != goodPin {
		t.Errorf("loaded %+v", c)
	}
	if c.JWKPath() != filepath.Join(filepath.Dir(p), JWKFile) {
		t.Errorf("JWKPath = %s", c.JWKPath())
	}
	if c.Join.Attestor != AttestorToken {
		t.Errorf("join.attestor defaults to %q, want token", c.Join.Attestor)
	}
}

func TestSessionTransportSetting(t *testing.T) {
	base := `server = "fleet.example:8443"
serving_ca_spki_pin = "` + goodPin + `"
join_signing_key_pin = "` + goodPin + `"
join_encryption_key_pin = "` + goodPin + `"
`
	c, err := LoadBCD(writeFile(t, base+"session_transport = \"grpc\"\n"))
	if err != nil || c.SessionTransport != "grpc" {
		t.Fatalf("session_transport = \"grpc\": %+v, %v", c, err)
	}
}

func TestJoinAttestorSetting(t *testing.T) {
	base := `server = "fleet.example:8443"
serving_ca_spki_pin = "` + goodPin + `"
join_signing_key_pin = "` + goodPin + `"
join_encryption_key_pin = "` + goodPin + `"
`
	c, err := LoadBCD(writeFile(t, base+"[join]\nattestor = \"tpm\"\n"))
	if err != nil || c.Join.Attestor != AttestorTPM {
		t.Fatalf("[join] attestor = \"tpm\": %+v, %v", c, err)
	}
	_, err = LoadBCD(writeFile(t, base+"[join]\nattestor = \"x509pop\"\n"))
	if err == nil || !strings.Contains(err.Error(), "join.attestor") {
		t.Errorf("an unknown attestor: %v, want an error naming join.attestor", err)
	}
}

func TestLoadBCDRefusals(t *testing.T) {
	base := map[string]string{
		"server":                  `"fleet.example:8443"`,
		"serving_ca_spki_pin":     `"` + goodPin + `"`,
		"join_signing_key_pin":    `"` + goodPin + `"`,
		"join_encryption_key_pin": `"` + goodPin + `"`,
	}
	cases := []struct {
		name, key, value, want string
	}{
		{"a malformed serving pin names its setting", "serving_ca_spki_pin", `"sha256:zz"`, "serving_ca_spki_pin"},
		{"a pin without the sha256 prefix names its setting", "join_signing_key_pin", `"0123"`, "join_signing_key_pin"},
		{"an upper-case pin names its setting", "join_encryption_key_pin", `"` + strings.ToUpper(goodPin) + `"`, "join_encryption_key_pin"},
		{"a missing pin names its setting", "join_encryption_key_pin", "", "join_encryption_key_pin is required"},
		{"a server without a port", "server", `"fleet.example"`, "server: want host:port"},
		{"an unknown setting", "colour", `"blue"`, "unknown setting colour"},
		{"an unknown session transport names its setting", "session_transport", `"quic"`, "session_transport"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			for k, v := range base {
				if k == tc.key {
					continue
				}
				b.WriteString(k + " = " + v + "\n")
			}
			if tc.value != "" {
				b.WriteString(tc.key + " = " + tc.value + "\n")
			}
			_, err := LoadBCD(writeFile(t, b.String()))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
