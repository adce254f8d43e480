package service_test

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/export"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/pki"
)

// The export endpoints refuse a request without an admin certificate
// (the roles are checked end to end in internal/integration/spire_test.go).
func TestExportEndpointsNeedAnAdminCertificate(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, service.ExportPath},
		{http.MethodGet, service.ExportHoldsPath},
		{http.MethodPost, service.ExportAllowPath},
		{http.MethodPost, service.ExportRunsPath},
	} {
		rec := httptest.NewRecorder()
		e.srv.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(c.method, c.path, strings.NewReader("{}")))
		if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "admin client certificate") {
			t.Errorf("%s %s without a certificate = %d %s", c.method, c.path, rec.Code, rec.Body)
		}
	}
}

// The export fleetd builds from its store lists its active nodes.
func TestExportDocumentListsActiveNodes(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(t, "web")
	body, digest, err := e.srv.ExportDocument(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	doc, got, err := export.Parse(body, e.auth.TrustDomain)
	if err != nil || got != digest {
		t.Fatalf("Parse: %v (digest %s, want %s)", err, got, digest)
	}
	if len(doc.Devices) != 1 || doc.Devices[0].NodeID != n.id || len(doc.Retired) != 0 {
		t.Fatalf("export %+v, want the one active node %s", doc, n.id)
	}
}

// An export call is an Admin call: audited as admin.call with its outcome,
// a success as OK and a failure as what it was.
func TestExportCallsAreAuditedAsAdminCalls(t *testing.T) {
	e := newEnv(t)
	owner, err := tls.LoadX509KeyPair(pki.Path(filepath.Join(e.dir, "pki"), pki.OwnerCertFile), pki.Path(filepath.Join(e.dir, "pki"), pki.OwnerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	issuer := e.auth.AdminCA
	if issuer == nil {
		issuer = e.auth.ServingCA
	}
	call := func(path string) int {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{owner.Leaf, issuer}}}
		rec := httptest.NewRecorder()
		e.srv.HTTPHandler().ServeHTTP(rec, r)
		return rec.Code
	}
	if code := call(service.ExportPath); code != http.StatusOK {
		t.Fatalf("GET the export as the owner = %d", code)
	}
	if code := call(service.ExportHoldsPath + "/sha256:00"); code != http.StatusNotFound {
		t.Fatalf("GET an unknown hold = %d, want 404", code)
	}
	got := map[string]string{}
	for _, a := range e.audit(t, "admin.call") {
		got[a.Subject] = a.Detail
	}
	if d := got["ExportRegistrations"]; !strings.HasSuffix(d, ": OK") {
		t.Errorf("the export's audit detail %q, want the call audited as OK", d)
	}
	if d := got["ExportHolds"]; !strings.HasSuffix(d, ": NotFound") {
		t.Errorf("the unknown hold's audit detail %q, want NotFound", d)
	}
}
