package integration

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/install"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/pki"
)

// httpsClient is a client of cp's HTTPS listener and its base URL.
func (cp *controlPlane) httpsClient(t *testing.T) (*http.Client, string) {
	t.Helper()
	m := httpsRE.FindStringSubmatch(cp.log.String())
	if m == nil {
		t.Fatalf("fleetd serves no HTTPS (http_listen):\n%s", cp.log)
	}
	ca, err := os.ReadFile(filepath.Join(cp.dir, "pki", pki.ServingCACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "fleetd.test"}}},
		"https://" + m[1]
}

// A config rendered into the store of a running fleetd, which is then
// killed and started again, is fetched once over the restarted fleetd's
// HTTPS listener with its code, the code then spent, and the node active.
func TestAConfigRenderedBeforeACrashIsReleasedOnceAfterIt(t *testing.T) {
	cp := startControlPlane(t, "http_listen = \"127.0.0.1:0\"\n")
	const uuid = "7e1c0f4a-0000-4000-8000-00000000c0de"
	config := []byte("version: v1alpha1\nmachine:\n  type: worker\n  install:\n    disk: /dev/sda\n")

	// Render as fleetd's admission would, into its store (a second opener
	// of the SQLite file), for a node admission made provisioning.
	s, err := sqlite.Open(t.Context(), filepath.Join(cp.dir, "data", "fleetd.db"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, _, err := s.TransitionNode(t.Context(), store.Transition{NodeID: "web-1", From: []string{store.StatePlanned}, To: store.StateProvisioning,
		Create: &store.Node{ID: "web-1", State: store.StatePlanned, Generation: 1, Role: "worker"}, Time: now, Actor: "test", Reason: "provision"}); err != nil {
		t.Fatal(err)
	}
	rel, err := install.New(install.Config{Store: s, Logger: slog.New(slog.DiscardHandler),
		Activator: install.LifecycleActivator{Manager: &lifecycle.Manager{Store: s}}})
	if err != nil {
		t.Fatal(err)
	}
	code, _, err := rel.Issue(t.Context(), install.Render{UUID: uuid, NodeID: "web-1", Config: config, ContentType: "application/yaml", Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	cp.kill(t)
	cp.serve(t)
	client, base := cp.httpsClient(t)
	get := func() (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+install.ConfigPath(uuid), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+code.Bearer())
		rsp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer rsp.Body.Close()
		b, err := io.ReadAll(rsp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return rsp.StatusCode, b
	}
	if st, b := get(); st != http.StatusOK || !bytes.Equal(b, config) {
		t.Fatalf("fetch after the restart: %d %q, want 200 and the config\n%s", st, b, cp.log)
	}
	// The burn is written once the acknowledgement came, after the body
	// reached the client; the activation follows it.
	cp.waitMetric(t, `nodetrust_config_activations_total{outcome="active"}`, 1)
	if st, b := get(); st != http.StatusGone {
		t.Fatalf("second fetch: %d %q, want 410 Gone", st, b)
	}
	if v := cp.metric(t, `nodetrust_config_fetches_total{outcome="released"}`); v != 1 {
		t.Fatalf("released fetches: %v, want 1", v)
	}
	if st := cp.nodeState(t, "web-1"); st != store.StateActive {
		t.Fatalf("node web-1 is %s, want active", st)
	}
	if strings.Contains(cp.log.String(), code.Bearer()) || strings.Contains(cp.log.String(), "/dev/sda") {
		t.Fatalf("fleetd's log holds the code or the config:\n%s", cp.log)
	}
}
