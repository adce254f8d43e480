package command

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTokenSource(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("  from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		src  tokenSource
		want string
	}{
		{"a file, trimmed", tokenSource{file: file}, "from-file"},
		{"the environment", tokenSource{env: "from-env", envSet: true}, "from-env"},
		{"standard input", tokenSource{stdin: strings.NewReader("from-stdin\n")}, "from-stdin"},
		{"a file wins over standard input", tokenSource{file: file, stdin: strings.NewReader("ignored")}, "from-file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.src.read()
			if err != nil || string(got) != tc.want {
				t.Fatalf("read = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestTokenSourceRefusals(t *testing.T) {
	cases := []struct {
		name string
		src  tokenSource
		want string
	}{
		{"two sources", tokenSource{file: "f", env: "e", envSet: true}, "exactly one source"},
		{"a terminal on standard input", tokenSource{stdin: strings.NewReader(""), terminal: true}, "pipe it on standard input"},
		{"an empty token", tokenSource{stdin: strings.NewReader(" \n")}, "empty"},
		{"an oversized token", tokenSource{stdin: strings.NewReader(strings.Repeat("x", maxTokenBytes+1))}, "longer than"},
		{"a missing file", tokenSource{file: filepath.Join(t.TempDir(), "absent")}, "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.src.read()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestTokenSourceWarnings(t *testing.T) {
	dir := t.TempDir()
	var told []string
	warn := func(m string) { told = append(told, m) }

	// A TPM join (optional token) takes a missing token file as no token,
	// and says so: the shipped unit names a file only the first boot has.
	got, err := tokenSource{file: filepath.Join(dir, "absent"), optional: true, warn: warn}.read()
	if err != nil || got != nil || len(told) != 1 || !strings.Contains(told[0], "joining with the TPM alone") {
		t.Errorf("a missing optional token file: %q, %v, told %q", got, err, told)
	}
	// A token join still needs the file.
	if _, err := (tokenSource{file: filepath.Join(dir, "absent"), warn: warn}).read(); err == nil {
		t.Error("a missing token file of a token join was not an error")
	}

	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	told = nil
	got, err = tokenSource{file: open, warn: warn}.read()
	if err != nil || string(got) != "tok" {
		t.Fatalf("read = %q, %v", got, err)
	}
	if len(told) != 1 || !strings.Contains(told[0], "readable by others (mode 0644): chmod 600 "+open) {
		t.Errorf("a token file others may read: told %q", told)
	}
	told = nil
	if err := os.Chmod(open, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (tokenSource{file: open, warn: warn}).read(); err != nil || len(told) != 0 {
		t.Errorf("a private token file: %v, told %q", err, told)
	}
}
