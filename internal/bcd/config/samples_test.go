package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The sample config.toml in conf/bcd loads with the real loaders, so
// the documentation does not drift from the code.
func TestSampleConfigLoads(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("../../../conf/bcd/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	// The sample's pins are placeholders of zeros, which are refused on
	// purpose; any real pin stands in for them.
	text := strings.ReplaceAll(string(b), "sha256:"+strings.Repeat("0", 64), goodPin)
	p := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadBCD(p); err != nil {
		t.Errorf("conf/bcd/config.toml: %v", err)
	}
}
