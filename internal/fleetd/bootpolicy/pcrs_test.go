package bootpolicy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
)

// pcrreadOutput is what `tpm2_pcrread sha1:0,1 sha256` prints: a SHA-1
// bank to skip, then every SHA-256 PCR, in upper-case hex with 0x.
func pcrreadOutput(pcrs map[int][]byte) string {
	var b strings.Builder
	b.WriteString("  sha1:\n    0 : 0x0000000000000000000000000000000000000000\n    1 : 0x1111111111111111111111111111111111111111\n  sha256:\n")
	for i := range 24 {
		v := make([]byte, 32)
		if p, ok := pcrs[i]; ok {
			v = p
		}
		fmt.Fprintf(&b, "    %d : 0x%X\n", i, v)
	}
	return b.String()
}

func TestParsePCRs(t *testing.T) {
	f := newFixture(t)
	want := f.talosBoot().PCRs()
	got, err := bootpolicy.ParsePCRs([]byte(pcrreadOutput(want)))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 {
		t.Fatalf("%d PCRs, want 0-7", len(got))
	}
	for i := range 8 {
		if string(got[i]) != string(want[i]) {
			t.Fatalf("PCR %d: %x, want %x", i, got[i], want[i])
		}
	}
	var plain strings.Builder
	plain.WriteString("# captured by hand\n\n")
	for i := range 8 {
		fmt.Fprintf(&plain, "%d: %x\n", i, want[i])
	}
	if _, err := bootpolicy.ParsePCRs([]byte(plain.String())); err != nil {
		t.Fatalf("lines without a bank header: %v", err)
	}

	for _, tc := range []struct{ name, in, want string }{
		{"a PCR missing", "sha256:\n" + strings.Join(lines(0, 7), ""), "no SHA-256 value for PCR 7"},
		{"only a SHA-1 bank", "sha1:\n0 : 0x00\n", "no SHA-256 value for PCR 0"},
		{"a PCR twice", "sha256:\n" + strings.Join(lines(0, 8), "") + "3 : 0x" + strings.Repeat("00", 32) + "\n", "PCR 3 is given twice"},
		{"a short value", "0 : 0xabcd\n", "line 1: PCR 0: want 64 hex digits"},
		{"an index that is not one", "x : 0x00\n", `"x" is not a PCR index`},
		{"PCR 24", "24 : 0x" + strings.Repeat("00", 32) + "\n", "is not a PCR index"},
		{"a line without a colon", "0 0x00\n", "line 1: want"},
		{"too much", strings.Repeat("#", bootpolicy.MaxPCRFileSize+1), "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bootpolicy.ParsePCRs([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func lines(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%d : 0x%s\n", i, strings.Repeat("00", 32)))
	}
	return out
}
