package export

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

func testCA(t *testing.T) *x509.Certificate {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "node CA"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testNodes() []store.Node {
	return []store.Node{
		{ID: "web-2", State: store.StateActive, Generation: 3, EKPin: "sha256:ab"},
		{ID: "web-1", State: store.StateActive, Generation: 1},
		{ID: "old-1", State: store.StateRetired, Generation: 2},
		{ID: "q-1", State: store.StateQuarantined},
		{ID: "p-1", State: store.StatePlanned},
		{ID: "r-1", State: store.StateRevoked},
	}
}

func TestBuildEligibleAndRetiredSortedWithSelectors(t *testing.T) {
	ca := testCA(t)
	env, digest, err := Build(testNodes(), Options{TrustDomain: "example.org", NodeCA: ca})
	if err != nil {
		t.Fatal(err)
	}
	doc, got, err := Parse(env, "example.org")
	if err != nil {
		t.Fatal(err)
	}
	if got != digest || !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("digest %q, parsed %q", digest, got)
	}
	var ids []string
	for _, d := range doc.Devices {
		ids = append(ids, d.NodeID)
	}
	if strings.Join(ids, ",") != "web-1,web-2" {
		t.Fatalf("eligible devices %v, want web-1,web-2 (active only, sorted)", ids)
	}
	if len(doc.Retired) != 1 || doc.Retired[0].NodeID != "old-1" {
		t.Fatalf("retired %+v", doc.Retired)
	}
	w1 := doc.Devices[0]
	if w1.SPIFFEID != "spiffe://example.org/node/web-1" {
		t.Fatalf("SPIFFE ID %q", w1.SPIFFEID)
	}
	fp := Fingerprint(ca)
	want := []string{"x509pop:ca:fingerprint:" + fp, "x509pop:subject:cn:web-1"}
	if len(w1.Agents) != 1 || strings.Join(w1.Agents[0].Selectors, " ") != strings.Join(want, " ") {
		t.Fatalf("web-1 agents %+v, want one x509pop match %v", w1.Agents, want)
	}
	if w2 := doc.Devices[1]; len(w2.Agents) != 2 || w2.Agents[1].Attestor != AttestorTPMDevID {
		t.Fatalf("web-2 (a TPM node) agents %+v, want x509pop and tpm_devid", w2.Agents)
	}
	// The same records give the same bytes and digest.
	env2, digest2, err := Build(testNodes(), Options{TrustDomain: "example.org", NodeCA: ca})
	if err != nil || digest2 != digest || string(env2) != string(env) {
		t.Fatalf("a second build differs: %v", err)
	}
}

func TestBuildEligibleStatesConfigurable(t *testing.T) {
	env, _, err := Build(testNodes(), Options{TrustDomain: "example.org", NodeCA: testCA(t), EligibleStates: []string{store.StateActive, store.StateQuarantined}})
	if err != nil {
		t.Fatal(err)
	}
	doc, _, err := Parse(env, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Devices) != 3 {
		t.Fatalf("%d devices, want 3 (active and quarantined)", len(doc.Devices))
	}
}

func TestParseRefuses(t *testing.T) {
	env, _, err := Build(testNodes(), Options{TrustDomain: "example.org", NodeCA: testCA(t)})
	if err != nil {
		t.Fatal(err)
	}
	var e Envelope
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatal(err)
	}
	reseal := func(doc string) []byte {
		b, _ := json.Marshal(Envelope{Version: Version, Digest: Digest([]byte(doc)), Document: json.RawMessage(doc)})
		return b
	}
	tampered := strings.Replace(string(env), "web-1", "web-9", 1)
	for _, c := range []struct {
		name string
		data []byte
		want error
		msg  string
	}{
		{"not JSON", []byte("<html>"), ErrMalformed, "invalid character"},
		{"truncated", env[:len(env)/2], ErrMalformed, ""},
		{"unknown version", []byte(`{"version":2,"digest":"x","document":{}}`), ErrMalformed, "version 2"},
		{"no document", []byte(`{"version":1,"digest":"x"}`), ErrMalformed, "no document"},
		{"a changed document", []byte(tampered), ErrUnverifiable, "does not match"},
		{"another trust domain", reseal(`{"version":1,"trust_domain":"evil.org","devices":[],"retired":[]}`), ErrMalformed, "trust domain"},
		{"no device list", reseal(`{"version":1,"trust_domain":"example.org","retired":[]}`), ErrMalformed, "must be present"},
		{"a foreign SPIFFE ID", reseal(`{"version":1,"trust_domain":"example.org","devices":[{"node_id":"a","spiffe_id":"spiffe://example.org/admin/a","state":"active","generation":1,"agents":[{"attestor":"x509pop","selectors":["x509pop:subject:cn:a"]}]}],"retired":[]}`), ErrMalformed, "SPIFFE ID"},
		{"a selector of another type", reseal(`{"version":1,"trust_domain":"example.org","devices":[{"node_id":"a","spiffe_id":"spiffe://example.org/node/a","state":"active","generation":1,"agents":[{"attestor":"x509pop","selectors":["unix:uid:0"]}]}],"retired":[]}`), ErrMalformed, "not an x509pop selector"},
		{"no selectors", reseal(`{"version":1,"trust_domain":"example.org","devices":[{"node_id":"a","spiffe_id":"spiffe://example.org/node/a","state":"active","generation":1,"agents":[]}],"retired":[]}`), ErrMalformed, "no agent selectors"},
		{"a device twice", reseal(`{"version":1,"trust_domain":"example.org","devices":[{"node_id":"a","spiffe_id":"spiffe://example.org/node/a","state":"active","generation":1,"agents":[{"attestor":"x509pop","selectors":["x509pop:subject:cn:a"]}]}],"retired":[{"node_id":"a","spiffe_id":"spiffe://example.org/node/a","state":"retired","generation":1,"agents":[{"attestor":"x509pop","selectors":["x509pop:subject:cn:a"]}]}]}`), ErrMalformed, "twice"},
		{"an unknown field", reseal(`{"version":1,"trust_domain":"example.org","devices":[],"retired":[],"extra":1}`), ErrMalformed, "unknown field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Parse(c.data, "example.org")
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("Parse: %v, want %v containing %q", err, c.want, c.msg)
			}
		})
	}
	if _, _, err := Parse([]byte(e.Digest), "example.org"); err == nil {
		t.Fatal("a bare digest parsed")
	}
}
