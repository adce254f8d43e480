package joinresponse

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki"
)

// testNow is the fixed time every test PKI is made at.
var testNow = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

const testTD = "example.test"

// newAuthority runs pki.Init in a fresh directory and loads the result.
func newAuthority(tb testing.TB) *pki.Authority {
	tb.Helper()
	dir := tb.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{TrustDomain: testTD, ServerName: "fleet.example.test", Now: testNow}); err != nil {
		tb.Fatalf("Init: %v", err)
	}
	a, err := pki.LoadAuthority(dir)
	if err != nil {
		tb.Fatalf("LoadAuthority: %v", err)
	}
	return a
}

// nodeRequest is a node's side of a join: its key, CSR and CSR hash.
type nodeRequest struct {
	key     *ecdsa.PrivateKey
	csr     []byte
	csrHash []byte
}

func newNodeRequest(tb testing.TB) nodeRequest {
	tb.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		tb.Fatalf("GenerateKey: %v", err)
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		tb.Fatalf("CreateCSR: %v", err)
	}
	h := sha256.Sum256(csr)
	return nodeRequest{key: key, csr: csr, csrHash: h[:]}
}

// issueLeaf issues a node certificate for key with a 24 h lifetime.
func issueLeaf(tb testing.TB, iss *pki.Issuer, key *ecdsa.PrivateKey, nodeID, role, site string) *x509.Certificate {
	tb.Helper()
	c, err := iss.Issue(pki.LeafRequest{
		PublicKey: key.Public(), NodeID: nodeID, Role: role, Site: site,
		NotBefore: testNow.Add(-time.Minute), NotAfter: testNow.Add(24 * time.Hour),
	})
	if err != nil {
		tb.Fatalf("Issue: %v", err)
	}
	return c
}

// joinResult builds the JoinResult a server would send for req.
func joinResult(tb testing.TB, a *pki.Authority, req nodeRequest, nodeID, role, site string) *joinv1.JoinResult {
	tb.Helper()
	leaf := issueLeaf(tb, a.Issuer, req.key, nodeID, role, site)
	r := &joinv1.JoinResult{
		CsrSha256:          req.csrHash,
		Chain:              [][]byte{leaf.Raw},
		Roots:              [][]byte{a.Root.Raw},
		NodeId:             nodeID,
		SpiffeId:           pki.NodeSPIFFEID(a.TrustDomain, nodeID),
		TrustDomain:        a.TrustDomain,
		Role:               role,
		Site:               site,
		IdentityGeneration: 1,
		ServerTimeUnixNano: testNow.UnixNano(),
	}
	for _, c := range a.Issuer.Chain() {
		r.Chain = append(r.Chain, c.Raw)
	}
	return r
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
