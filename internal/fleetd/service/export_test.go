package service_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/export"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
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
