package passmarker

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var golden = Marker{UUID: "6A1F5C1E-0000-4000-8000-000000000001", BootID: "0f8e2a51-6a43-4cfc-9a7c-52c2c4a3a1b9",
	Time: time.Date(2026, 12, 2, 13, 0, 0, 0, time.FixedZone("CET", 3600))}

// testdata/boot-pass is the format's example; fleetd's provision script
// test feeds the same file to the script, so writer and reader agree.
func TestMarshalIsTheGoldenFile(t *testing.T) {
	want, err := os.ReadFile(filepath.Join("testdata", "boot-pass"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := golden.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Marshal:\n%s\nwant testdata/boot-pass:\n%s", got, want)
	}
	m, err := Parse(want)
	if err != nil {
		t.Fatal(err)
	}
	if m.UUID != strings.ToLower(golden.UUID) || m.BootID != golden.BootID || !m.Time.Equal(golden.Time) {
		t.Fatalf("Parse: %+v", m)
	}
}

func TestMarshalAndParseRefuse(t *testing.T) {
	for _, m := range []Marker{
		{UUID: "not-a-uuid", BootID: golden.BootID, Time: golden.Time},
		{UUID: golden.UUID, BootID: "0f8e2a51\nverdict pass", Time: golden.Time},
		{UUID: golden.UUID, BootID: golden.BootID},
	} {
		if b, err := m.Marshal(); err == nil {
			t.Errorf("Marshal(%+v) = %q, want an error", m, b)
		}
	}
	good, _ := golden.Marshal()
	for name, b := range map[string][]byte{
		"verdict fail": bytes.Replace(good, []byte("verdict pass"), []byte("verdict fail"), 1),
		"version 2":    bytes.Replace(good, []byte("pass 1"), []byte("pass 2"), 1),
		"extra line":   append(append([]byte{}, good...), "uuid x\n"...),
		"oversized":    bytes.Repeat([]byte("x"), MaxBytes+1),
		"a time zone":  bytes.Replace(good, []byte("12:00:00Z"), []byte("13:00:00+01:00"), 1),
	} {
		if _, err := Parse(b); err == nil {
			t.Errorf("Parse accepted a marker with %s", name)
		}
	}
}

func TestWriteAndBootID(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "nodetrust")
	path := filepath.Join(dir, "boot-pass")
	bootFile := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(bootFile, []byte(golden.BootID+"\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	id, err := BootID(bootFile)
	if err != nil || id != golden.BootID {
		t.Fatalf("BootID: %q, %v", id, err)
	}
	if err := Write(path, Marker{UUID: golden.UUID, BootID: id, Time: golden.Time}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("marker mode %v, want 0600", fi.Mode().Perm())
	}
	di, err := os.Stat(dir)
	if err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("marker directory: %v, %v; want mode 0700", di.Mode().Perm(), err)
	}
	b, _ := os.ReadFile(path)
	if _, err := Parse(b); err != nil {
		t.Fatalf("the written marker does not parse: %v", err)
	}
	// The machine's own boot id, where there is one.
	if _, err := os.Stat(DefaultBootIDPath); err == nil {
		if _, err := BootID(""); err != nil {
			t.Fatalf("the kernel's boot id: %v", err)
		}
	}
}

func FuzzParse(f *testing.F) {
	good, err := os.ReadFile(filepath.Join("testdata", "boot-pass"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(Header + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		b, err := m.Marshal()
		if err != nil {
			t.Fatalf("Parse accepted a marker Marshal refuses: %+v: %v", m, err)
		}
		again, err := Parse(b)
		if err != nil || again.UUID != m.UUID || again.BootID != m.BootID || !again.Time.Equal(m.Time) {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, m)
		}
	})
}
