//go:build tpmsim

package netreport

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/pki/netreport"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// The device key lives in the TPM: a report signed by a TPM-held key (the
// simulator's, through crypto.Signer) verifies under its public key, and
// under no other.
func TestSimSignWithTPMKey(t *testing.T) {
	tp, _ := tpmtest.OpenSim(t)
	key, _, err := tp.NewNodeKey(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	rep, err := Build(t.Context(), Reader{File: filepath.Join("testdata", "lldpctl-two.json")}, "nt-eth1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s, err := netreport.Sign(rep, key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := netreport.Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.Verify(key.Public()); err != nil {
		t.Fatalf("a report the TPM key signed does not verify: %v", err)
	}
	other, _, err := tp.NewNodeKey(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := got.Verify(other.Public()); err == nil {
		t.Fatal("the report verified under another TPM key")
	}
}
