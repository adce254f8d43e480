package tpm_test

import (
	"bytes"
	"slices"
	"testing"

	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// TestSplitEKChain splits the chain indices as vendors fill them: several
// DER certificates one after the other in one index (padded with 0xFF or
// 0x00), more in the next index, certificate indices left alone.
func TestSplitEKChain(t *testing.T) {
	root := tpmtest.NewManufacturer(t, "Root", nil)
	a := tpmtest.NewManufacturer(t, "A", root)
	b := tpmtest.NewManufacturer(t, "B", a)
	pad := func(n int, c byte) []byte { return bytes.Repeat([]byte{c}, n) }
	certs := map[uint32][]byte{
		tpm.EKCertIndexRSA2048:      []byte("the EK certificate, not split"),
		tpm.EKChainIndexFirst:       slices.Concat(b.Cert.Raw, a.Cert.Raw, pad(40, 0xFF)),
		tpm.EKChainIndexFirst + 1:   slices.Concat(root.Cert.Raw, pad(3, 0)),
		tpm.EKChainIndexFirst + 100: {},
	}
	got, err := tpm.SplitEKChain(certs)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]byte{b.Cert.Raw, a.Cert.Raw, root.Cert.Raw}
	if !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("split into %d certificates, want b, a, root", len(got))
	}
	if got, err := tpm.SplitEKChain(map[uint32][]byte{tpm.EKCertIndexECCP256: root.Cert.Raw}); err != nil || len(got) != 0 {
		t.Fatalf("no chain index: %d certificates, %v", len(got), err)
	}
	if _, err := tpm.SplitEKChain(map[uint32][]byte{tpm.EKChainIndexFirst: slices.Concat(a.Cert.Raw, []byte("junk"))}); err == nil {
		t.Error("junk after a certificate was accepted")
	}
	many := map[uint32][]byte{tpm.EKChainIndexFirst: bytes.Repeat(a.Cert.Raw, tpm.MaxEKChainCertificates+1)}
	if _, err := tpm.SplitEKChain(many); err == nil {
		t.Error("more than MaxEKChainCertificates were accepted")
	}
}
