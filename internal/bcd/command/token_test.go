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
