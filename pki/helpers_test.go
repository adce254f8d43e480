package pki

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"
)

// testNow is the fixed time every test PKI is made at.
var testNow = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

const testTD = "example.test"

// newAuthority runs Init in a fresh directory and loads the result.
func newAuthority(tb testing.TB, kem string) (*Authority, string) {
	tb.Helper()
	dir := tb.TempDir()
	if _, err := Init(dir, InitOptions{TrustDomain: testTD, ServerName: "fleet.example.test", KEM: kem, Now: testNow}); err != nil {
		tb.Fatalf("Init: %v", err)
	}
	a, err := LoadAuthority(dir)
	if err != nil {
		tb.Fatalf("LoadAuthority: %v", err)
	}
	return a, dir
}

// nodeRequest is a node's side of a join: its key, CSR and CSR hash.
type nodeRequest struct {
	key     *ecdsa.PrivateKey
	csr     []byte
	csrHash []byte
}

func newNodeRequest(tb testing.TB) nodeRequest {
	tb.Helper()
	key := mustKey(tb)
	csr, err := CreateCSR(key)
	if err != nil {
		tb.Fatalf("CreateCSR: %v", err)
	}
	h := sha256.Sum256(csr)
	return nodeRequest{key: key, csr: csr, csrHash: h[:]}
}

func mustKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := GenerateKey()
	if err != nil {
		tb.Fatalf("GenerateKey: %v", err)
	}
	return k
}

// issueLeaf issues a node certificate for key with a 24 h lifetime.
func issueLeaf(tb testing.TB, iss *Issuer, key *ecdsa.PrivateKey, nodeID, role, site string, ak []byte) *x509.Certificate {
	tb.Helper()
	c, err := iss.Issue(LeafRequest{
		PublicKey: key.Public(), NodeID: nodeID, Role: role, Site: site, TPMAKName: ak,
		NotBefore: testNow.Add(-time.Minute), NotAfter: testNow.Add(24 * time.Hour),
	})
	if err != nil {
		tb.Fatalf("Issue: %v", err)
	}
	return c
}

// wantErr fails unless err wraps target (when set) and contains substr.
func wantErr(t *testing.T, err, target error, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", substr)
	}
	if target != nil && !errors.Is(err, target) {
		t.Errorf("error %q does not wrap %v", err, target)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Errorf("error %q does not contain %q", err, substr)
	}
}
