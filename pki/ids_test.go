package pki

import (
	"strings"
	"testing"
)

func TestValidTrustDomain(t *testing.T) {
	good := []string{"example.org", "a", "td_1-x.y", strings.Repeat("a", 255)}
	for _, td := range good {
		if err := ValidTrustDomain(td); err != nil {
			t.Errorf("ValidTrustDomain(%q): %v", td, err)
		}
	}
	tests := []struct {
		name, in, want string
	}{
		{"an empty trust domain is refused", "", "empty"},
		{"256 characters are too many", strings.Repeat("a", 256), "more than 255"},
		{"upper case is refused", "Example.org", `'E' at offset 0`},
		{"a port is refused", "example.org:443", `':'`},
		{"a slash is refused", "example.org/x", `'/'`},
		{"a non-ASCII letter is refused", "exämple.org", "is not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, ValidTrustDomain(tt.in), nil, tt.want)
		})
	}
}

func TestValidNodeID(t *testing.T) {
	good := []string{"n1", "0", "worker-01.rack_2", strings.Repeat("a", 63)}
	for _, id := range good {
		if err := ValidNodeID(id); err != nil {
			t.Errorf("ValidNodeID(%q): %v", id, err)
		}
	}
	tests := []struct {
		name, in, want string
	}{
		{"an empty id is refused", "", "empty"},
		{"64 characters are too many", strings.Repeat("a", 64), "more than 63"},
		{"a leading dash is refused", "-n1", "must start with"},
		{"a leading dot is refused", ".n1", "must start with"},
		{"upper case is refused", "Node1", "must start with"},
		{"upper case inside is refused", "nOde", `'O' at offset 1`},
		{"a slash is refused", "n/1", `'/'`},
		{"a space is refused", "n 1", `' '`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, ValidNodeID(tt.in), nil, tt.want)
		})
	}
}

func TestNodeSPIFFEID(t *testing.T) {
	if got, want := NodeSPIFFEID("example.org", "n1"), "spiffe://example.org/node/n1"; got != want {
		t.Errorf("NodeSPIFFEID = %q, want %q", got, want)
	}
	for _, bad := range [][2]string{{"Example.org", "n1"}, {"example.org", "N1"}, {"", "n1"}, {"example.org", "a/b"}} {
		if got := NodeSPIFFEID(bad[0], bad[1]); got != "" {
			t.Errorf("NodeSPIFFEID(%q, %q) = %q, want \"\" for an invalid part", bad[0], bad[1], got)
		}
	}
}
