package service_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
)

func TestWellKnownDocument(t *testing.T) {
	e := newEnv(t)
	want, err := service.WellKnownDocument(e.auth, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, pin := range []string{e.bundle.ServingCASPKIPin.String(), e.bundle.JoinSigningKeyPin.String(), e.bundle.JoinEncryptionKeyPin.String()} {
		if !bytes.Contains(want, []byte(pin)) {
			t.Errorf("the document lacks pin %s", pin)
		}
	}
	t.Run("over gRPC with the server's time", func(t *testing.T) {
		resp, err := e.join.GetWellKnown(t.Context(), &joinv1.GetWellKnownRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(resp.Document, want) || resp.ServerTimeUnixNano != e.clock.Now().UnixNano() {
			t.Errorf("GetWellKnown = %s at %d", resp.Document, resp.ServerTimeUnixNano)
		}
	})
	t.Run("over HTTPS at the well-known path", func(t *testing.T) {
		rec := httptest.NewRecorder()
		e.srv.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, service.WellKnownPath, nil))
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || !bytes.Equal(rec.Body.Bytes(), want) {
			t.Errorf("GET %s = %d %q %s", service.WellKnownPath, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
	})
}

// TestMetricsCountOutcomes checks the counters hostile traffic lands in
// instead of the audit trail.
func TestMetricsCountOutcomes(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(t, "web")
	// Refused joins: one with the token attestor, one with an attestor
	// the server does not know (counted as "other", so callers cannot
	// grow the label set).
	m := newMachine(t, "x")
	for _, attestor := range []string{"token", "made-up"} {
		req := e.request(t, m, "ntjt_unknown")
		req.Attestor = attestor
		if _, err := e.join.Join(t.Context(), req); err == nil {
			t.Fatal("a join with an unknown token succeeded")
		}
	}
	client, gw := e.nodeClients(t, n)
	if _, err := client.Renew(t.Context(), e.renewal(t, n).req); err != nil {
		t.Fatal(err)
	}
	openSession(t, gw, "proc-a")

	rec := httptest.NewRecorder()
	e.srv.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, line := range []string{
		`nodetrust_join_requests_total{attestor="token",outcome="signed"} 1`,
		`nodetrust_join_requests_total{attestor="token",outcome="refused"} 1`,
		`nodetrust_join_requests_total{attestor="other",outcome="refused"} 1`,
		`nodetrust_renewals_total{code="OK"} 1`,
		`nodetrust_live_sessions 1`,
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	if strings.Contains(body, "made-up") {
		t.Error("/metrics names an attestor a caller made up")
	}
}

// TestClaimsAreCapped sends claims larger than the server keeps: they are
// stored cut to 256 bytes of valid UTF-8, and at most 64 of a list.
func TestClaimsAreCapped(t *testing.T) {
	e := newEnv(t)
	secret, _ := e.token(t, nil)
	m := newMachine(t, "")
	// The 256th byte falls inside "é": the cut must not leave half of it.
	m.claims.Hostname = strings.Repeat("h", 255) + "é" + strings.Repeat("t", 100)
	m.claims.Macs = make([]string, 100)
	for i := range m.claims.Macs {
		m.claims.Macs[i] = fmt.Sprintf("02:00:00:00:00:%02x", i)
	}
	n := e.mustJoin(t, m, e.request(t, m, secret))
	got := e.storedNode(t, n.id).Claims
	if want := strings.Repeat("h", 255) + "?"; got.Hostname != want || !utf8.ValidString(got.Hostname) {
		t.Errorf("stored hostname %q (%d bytes), want at most 256 bytes of valid UTF-8", got.Hostname, len(got.Hostname))
	}
	if len(got.MACs) != 64 {
		t.Errorf("%d MACs stored, want the first 64", len(got.MACs))
	}
	if n.id != strings.Repeat("h", 40) {
		t.Errorf("node id %q, want the hostname's first 40 characters", n.id)
	}
}
