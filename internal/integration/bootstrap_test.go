package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// freeAddr returns a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestWellKnownDocumentOverHTTPS(t *testing.T) {
	httpAddr := freeAddr(t)
	cp := startControlPlane(t, fmt.Sprintf("http_listen = %q\n", httpAddr))
	pin, err := pki.ParsePin(cp.bundle.ServingCASPKIPin)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlspin.Client(pin, "fleetd.test", nil)}}
	resp, err := client.Get("https://" + httpAddr + "/.well-known/nodetrust.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var doc struct {
		TrustDomain          string          `json:"trust_domain"`
		ServingCASPKIPin     string          `json:"serving_ca_spki_pin"`
		JoinSigningKeyPin    string          `json:"join_signing_key_pin"`
		JoinEncryptionKeyPin string          `json:"join_encryption_key_pin"`
		JWK                  json.RawMessage `json:"join_encryption_jwk"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("document: %v\n%s", err, body)
	}
	if doc.TrustDomain != cp.bundle.TrustDomain || doc.ServingCASPKIPin != cp.bundle.ServingCASPKIPin ||
		doc.JoinSigningKeyPin != cp.bundle.JoinSigningKeyPin || doc.JoinEncryptionKeyPin != cp.bundle.JoinEncryptionKeyPin {
		t.Errorf("document %s does not match pki-bundle.json %+v", body, cp.bundle)
	}
	jwk, err := pki.ParseJWK(doc.JWK)
	if err != nil {
		t.Fatalf("the document's JWK: %v", err)
	}
	if jwk.Pin().String() != cp.bundle.JoinEncryptionKeyPin {
		t.Errorf("the JWK's pin %s is not join_encryption_key_pin %s", jwk.Pin(), cp.bundle.JoinEncryptionKeyPin)
	}
	fileJWK, err := os.ReadFile(filepath.Join(cp.dir, "pki", "join-encryption.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	if fj, err := pki.ParseJWK(fileJWK); err != nil || !fj.Equal(jwk) {
		t.Errorf("join-encryption.jwk differs from the served key (%v)", err)
	}

	t.Run("metrics count joins by outcome and the live sessions", func(t *testing.T) {
		m := newMachine(t, cp, "", "")
		m.join(t, cp)
		other := newMachine(t, cp, "", "")
		assertRefused(t, run(t, "ntjt_not-a-token", other.env(), "bcd", "join", "--config", other.cfg))
		a := startAgent(t, m)
		a.waitFor(t, sessionOpenRE, 30*time.Second)
		resp, err := client.Get("https://" + httpAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, want := range []string{
			`nodetrust_join_requests_total{attestor="token",outcome="signed"} 1`,
			`nodetrust_join_requests_total{attestor="token",outcome="refused"} 1`,
			`nodetrust_live_sessions 1`,
		} {
			if !strings.Contains(string(body), want) {
				t.Errorf("/metrics lacks %q:\n%s", want, body)
			}
		}
	})
}

func TestJoinFromConfigFile(t *testing.T) {
	cp := startControlPlane(t, "")
	etc := t.TempDir()
	dataDir := filepath.Join(t.TempDir(), "bcd")
	cfg := fmt.Sprintf("server = %q\nserver_name = \"fleetd.test\"\ndata_dir = %q\nrole = \"worker\"\nserving_ca_spki_pin = %q\njoin_signing_key_pin = %q\njoin_encryption_key_pin = %q\n",
		cp.addr, dataDir, cp.bundle.ServingCASPKIPin, cp.bundle.JoinSigningKeyPin, cp.bundle.JoinEncryptionKeyPin)
	cfgPath := filepath.Join(etc, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	jwk, err := os.ReadFile(filepath.Join(cp.dir, "pki", "join-encryption.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "join-encryption.jwk"), jwk, 0o644); err != nil {
		t.Fatal(err)
	}
	tok := cp.token(t, "--role", "worker")
	r := run(t, "", append(claimsEnv(t), "BCD_JOIN_TOKEN="+tok), "bcd", "join", "--config", cfgPath)
	if r.code != 0 || !joinedRE.MatchString(r.stdout) {
		t.Fatalf("join from config.toml with the token in BCD_JOIN_TOKEN: %s", r)
	}
	st := run(t, "", nil, "bcd", "status", "--config", cfgPath, "--json")
	if st.code != 0 || !strings.Contains(st.stdout, `"role": "worker"`) {
		t.Errorf("bcd status --config: %s", st)
	}

	t.Run("a malformed pin in config.toml names the setting", func(t *testing.T) {
		bad := strings.Replace(cfg, cp.bundle.JoinSigningKeyPin, "sha256:ABC", 1)
		p := filepath.Join(t.TempDir(), "config.toml")
		if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, "", nil, "bcd", "join", "--config", p)
		if r.code == 0 || !strings.Contains(r.stderr, "join_signing_key_pin") {
			t.Errorf("malformed pin in config.toml: %s", r)
		}
	})
}

func TestBootstrapRefusesADocumentThatDoesNotMatchThePins(t *testing.T) {
	cp := startControlPlane(t, "")
	other := startControlPlane(t, "")
	tok := cp.token(t, "--role", "worker")
	args := cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))
	for i, a := range args {
		if a == cp.bundle.JoinSigningKeyPin {
			args[i] = other.bundle.JoinSigningKeyPin
		}
	}
	r := run(t, tok, claimsEnv(t), "bcd", args...)
	if r.code != 1 || !strings.Contains(r.stderr, "well-known document's join_signing_key_pin") {
		t.Fatalf("bootstrap with a signing pin the document does not have: %s", r)
	}
}

func TestReclaimNeedsAnAllowingToken(t *testing.T) {
	cp := startControlPlane(t, "")
	// One simulated machine: the same product UUID for every join.
	root := t.TempDir()
	dmi := filepath.Join(root, "sys", "class", "dmi", "id")
	if err := os.MkdirAll(dmi, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dmi, "product_uuid"), []byte("4c4c4544-0031-3510-8052-b4c04f4e4e31\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"NODETRUST_DEBUG_CLAIMS_ROOT=" + root}
	first := run(t, cp.token(t, "--role", "worker"), env, "bcd", cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))...)
	m := joinedRE.FindStringSubmatch(first.stdout)
	if m == nil {
		t.Fatalf("first join: %s", first)
	}
	node := m[1]

	assertRefused(t, run(t, cp.token(t, "--role", "worker"), env, "bcd", cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))...))
	if !strings.Contains(cp.log.String(), "already known as node "+node) {
		t.Errorf("the server did not log why it refused the second join")
	}

	again := run(t, cp.token(t, "--role", "worker", "--allow-reclaim"), env, "bcd", cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))...)
	if m := joinedRE.FindStringSubmatch(again.stdout); m == nil || m[1] != node {
		t.Fatalf("reclaim with --allow-reclaim: %s", again)
	}
	show := run(t, "", nil, "fleetd", "nodes", "show", node, "--config", cp.config, "--json")
	if !strings.Contains(show.stdout, `"identity_generation": 2`) {
		t.Errorf("after the reclaim the node's generation is not 2: %s", show)
	}
}
