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

func TestLoadFleetd(t *testing.T) {
	p := writeFile(t, "pki_dir = \"pki\"\ndata_dir = \"data\"\nlisten = \"0.0.0.0:9443\"\n")
	c, err := LoadFleetd(p)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(p)
	if got := c.Resolve(c.PKIDir); got != filepath.Join(dir, "pki") {
		t.Errorf("Resolve(pki_dir) = %s", got)
	}
	if c.Store.Path != filepath.Join("data", "fleetd.db") || c.Resolve(c.Store.Path) != filepath.Join(dir, "data", "fleetd.db") {
		t.Errorf("store path = %s", c.Store.Path)
	}
	if c.AdminAddress() != "127.0.0.1:9443" {
		t.Errorf("AdminAddress = %s", c.AdminAddress())
	}
	if c.NodeCertLifetime.Duration != MaxNodeCertLifetime {
		t.Errorf("default lifetime %s", c.NodeCertLifetime)
	}
}

func TestLoadFleetdRefusals(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"no pki_dir", "data_dir = \"d\"\n", "pki_dir is required"},
		{"a lifetime over 24h", "pki_dir = \"p\"\ndata_dir = \"d\"\nnode_cert_lifetime = \"25h\"\n", "node_cert_lifetime"},
		{"a malformed duration", "pki_dir = \"p\"\ndata_dir = \"d\"\ntoken_ttl = \"soon\"\n", "duration"},
		{"an unknown store", "pki_dir = \"p\"\ndata_dir = \"d\"\n[store]\ndriver = \"mysql\"\n", "store.driver"},
		{"a bad log level", "pki_dir = \"p\"\ndata_dir = \"d\"\nlog_level = \"loud\"\n", "log_level"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFleetd(writeFile(t, tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
