package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
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
		{"a relative PKCS#11 module", "pki_dir = \"p\"\ndata_dir = \"d\"\n[pkcs11]\nmodule = \"libsofthsm2.so\"\n", "pkcs11.module"},
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
