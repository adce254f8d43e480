package localapi

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func testRuntime() *Runtime {
	return &Runtime{Version: RuntimeVersion, Namespace: "fleet.example", NodeID: "node-a", BootID: "boot-1", Socket: "/var/lib/bcd/run/bcd.sock",
		Sender: "trainer", KeyFile: "/var/lib/bcd/run/instances/trainer.1/key", StartedAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func TestRuntimeRoundTrip(t *testing.T) {
	b, err := testRuntime().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRuntime(b)
	if err != nil {
		t.Fatal(err)
	}
	if *r != *testRuntime() {
		t.Fatalf("round trip %+v", r)
	}
	for _, bad := range []string{`{"version":2}`, strings.Replace(string(b), `"sender"`, `"sendr"`, 1), string(b) + "{}"} {
		if _, err := ParseRuntime([]byte(bad)); err == nil {
			t.Errorf("ParseRuntime(%q) took it", bad)
		}
	}
}

func TestRuntimeFromEnvSaysWhatToDo(t *testing.T) {
	t.Setenv(EnvRuntime, "")
	if _, err := RuntimeFromEnv(); err == nil || !strings.Contains(err.Error(), "bcd run") {
		t.Errorf("RuntimeFromEnv without %s: %v", EnvRuntime, err)
	}
}

func TestKeyFile(t *testing.T) {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	b, err := MarshalKey(k)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadKeyFile(p)
	if err != nil || !got.Equal(k) {
		t.Fatalf("ReadKeyFile: %v", err)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadKeyFile(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a key file of mode 0640: %v", err)
	}
	if _, err := ParseKey(append(bytes.Clone(b), "junk"...)); err == nil {
		t.Error("ParseKey took data after the PEM block")
	}
}

// FuzzParseRuntime: parsing never panics, and what parses marshals and
// parses back to the same configuration.
func FuzzParseRuntime(f *testing.F) {
	b, _ := testRuntime().Marshal()
	f.Add(b)
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRuntime(data)
		if err != nil {
			return
		}
		again, err := r.Marshal()
		if err != nil {
			t.Fatalf("parsed configuration does not marshal: %v", err)
		}
		r2, err := ParseRuntime(again)
		if err != nil || !r2.StartedAt.Equal(r.StartedAt) {
			t.Fatalf("round trip: %v", err)
		}
		r2.StartedAt = r.StartedAt
		if *r2 != *r {
			t.Fatalf("round trip changed %+v to %+v", r, r2)
		}
	})
}

// FuzzParseKey: parsing never panics.
func FuzzParseKey(f *testing.F) {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	b, _ := MarshalKey(k)
	f.Add(b)
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParseKey(data)
		if err == nil && len(k) != ed25519.PrivateKeySize {
			t.Fatalf("ParseKey returned a %d-byte key", len(k))
		}
	})
}
