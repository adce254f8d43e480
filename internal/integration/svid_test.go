package integration

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// verifySVID parses and verifies the chain the node stored as an
// X.509-SVID with go-spiffe, against the roots of its identity, as a
// SPIFFE-aware service would, and checks the SPIFFE ID is the node's.
func verifySVID(t *testing.T, st *identity.State) spiffeid.ID {
	t.Helper()
	td, err := spiffeid.TrustDomainFromString(st.Identity.TrustDomain)
	if err != nil {
		t.Fatal(err)
	}
	bundle := x509bundle.FromX509Authorities(td, st.Roots)
	id, _, err := x509svid.ParseAndVerify(st.Identity.Chain, bundle, x509svid.WithTime(st.Leaf.NotBefore.Add(time.Second)))
	if err != nil {
		t.Fatalf("go-spiffe refuses the node certificate (URIs %v): %v", st.Leaf.URIs, err)
	}
	if id.String() != st.Identity.SPIFFEID || id.String() != "spiffe://"+st.Identity.TrustDomain+"/node/"+st.Identity.NodeID {
		t.Errorf("x509svid reads SPIFFE ID %s, the identity is %s", id, st.Identity.SPIFFEID)
	}
	return id
}

// akNameOf returns the TPM AK name the node certificate carries, failing
// when it is carried anywhere but nodetrust's extension.
func akNameOf(t *testing.T, leaf *x509.Certificate) []byte {
	t.Helper()
	info, err := pki.ParseNodeCert(leaf)
	if err != nil {
		t.Fatal(err)
	}
	if info.LegacyAKURN || len(leaf.URIs) != 1 {
		t.Errorf("the certificate names the AK in a URI SAN: %v", leaf.URIs)
	}
	return info.TPMAKName
}

func TestATPMNodeWithAnOldFormCertificateRenewsIntoTheNewForm(t *testing.T) {
	sw := tpmtest.StartSwtpm(t)
	cp := startControlPlane(t, "node_cert_lifetime = \"6s\"\n"+ekRootsConfig(t, sw))
	m := newMachine(t, cp, "", "tpm = \""+sw.Spec()+"\"\n")
	if r := run(t, cp.token(t, "--role", "gpu"), m.env(), "bcd", "join", "--config", m.cfg, "--attestor", "tpm"); r.code != 0 {
		t.Fatalf("tpm join: %s", r)
	}
	st, err := loadWithTPM(t, sw, m.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	verifySVID(t, st)
	ak := akNameOf(t, st.Leaf)
	if len(ak) == 0 {
		t.Fatal("the certificate of a tpm join names no AK")
	}

	// The certificate a node joined before this change holds: the same
	// serial, key and validity, with the AK as a second URI SAN, signed by
	// the node CA.
	nodeCAKey, err := pki.ReadPrivateKey(filepath.Join(cp.dir, "pki", pki.NodeCAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	old := *st.Leaf
	akURN, err := url.Parse(pki.TPMAKURNPrefix + hex.EncodeToString(ak))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: old.SerialNumber, Subject: old.Subject, NotBefore: old.NotBefore, NotAfter: old.NotAfter,
		KeyUsage: old.KeyUsage, ExtKeyUsage: old.ExtKeyUsage, BasicConstraintsValid: true,
		URIs: []*url.URL{old.URIs[0], akURN},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, st.Chain[1], old.PublicKey, nodeCAKey)
	if err != nil {
		t.Fatal(err)
	}
	rewriteLeaf(t, m.dataDir, der)
	legacy, err := loadWithTPM(t, sw, m.dataDir)
	if err != nil {
		t.Fatalf("the old-form identity does not load: %v", err)
	}
	if info, err := pki.ParseNodeCert(legacy.Leaf); err != nil || !info.LegacyAKURN || !bytes.Equal(info.TPMAKName, ak) {
		t.Fatalf("the rewritten certificate is not of the old form: %+v, %v", info, err)
	}

	runUntilRenewed(t, m, 1)
	renewed, err := loadWithTPM(t, sw, m.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if renewed.Leaf.SerialNumber.Cmp(old.SerialNumber) == 0 {
		t.Fatal("the node did not renew its old-form certificate")
	}
	verifySVID(t, renewed)
	if got := akNameOf(t, renewed.Leaf); !bytes.Equal(got, ak) {
		t.Errorf("the renewed certificate names AK %x, want %x", got, ak)
	}
}

// runUntilRenewed runs bcd node for m until it renewed n times, then stops
// it and checks it exits cleanly.
func runUntilRenewed(t *testing.T, m *machine, n int) {
	t.Helper()
	a := startAgent(t, m)
	for range n {
		a.waitFor(t, renewedRE, 60*time.Second)
	}
	_ = a.cmd.Process.Signal(os.Interrupt)
	if code := a.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("bcd node exited %d:\n%s", code, a.log)
	}
}

// rewriteLeaf replaces the leaf of identity.json in dataDir.
func rewriteLeaf(t *testing.T, dataDir string, der []byte) {
	t.Helper()
	p := filepath.Join(dataDir, "identity.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var id identity.Identity
	if err := json.Unmarshal(b, &id); err != nil {
		t.Fatal(err)
	}
	id.Chain[0] = der
	out, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, out, 0o600); err != nil {
		t.Fatal(err)
	}
}
