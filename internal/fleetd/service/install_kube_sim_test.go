//go:build tpmsim

package service_test

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodetrust/nodetrust/internal/fleetd/kube"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube/kubetest"
	"github.com/nodetrust/nodetrust/internal/fleetd/render"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
)

// recordingRenderer renders with the class's template and keeps the
// bootstrap token each render was given.
type recordingRenderer struct {
	next   service.Renderer
	mu     sync.Mutex
	tokens []string
}

func (r *recordingRenderer) Render(in render.Input) (render.Config, error) {
	r.mu.Lock()
	r.tokens = append(r.tokens, in.KubeBootstrapToken)
	r.mu.Unlock()
	return r.next.Render(in)
}

// TestSimInstallCarriesTheWorkersBootstrapToken: with [kubernetes], a
// worker's render is given its own bootstrap token, a Secret in the real
// API server labelled with the node, expiring the token lifetime after the
// render; the audit names the token's id, never its secret.
func TestSimInstallCarriesTheWorkersBootstrapToken(t *testing.T) {
	c := kubetest.Start(t)
	ie := newInstallEnv(t, "rack1")
	rec := &recordingRenderer{next: ie.set.Renderers}
	set := ie.set
	set.Renderers = rec
	set.KubeTokens = kube.TokenIssuer{Client: c.Admin(t), Signer: ie.auth.JoinSigner, TTL: 3 * time.Hour}
	ie.srv.SetInstall(set)
	now := ie.clock.Now()
	if _, err := ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", time.Minute), ie.m.key, now)); err != nil {
		t.Fatalf("install: %v", err)
	}
	if len(rec.tokens) != 1 || rec.tokens[0] == "" {
		t.Fatalf("the render was given %d tokens, want one", len(rec.tokens))
	}
	id, secret, _ := strings.Cut(rec.tokens[0], ".")
	s, err := c.Admin(t).CoreV1().Secrets(kube.TokenNamespace).Get(t.Context(), "bootstrap-token-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the render's token is not in the cluster: %v", err)
	}
	if s.Labels[kube.NodeLabel] != "web-01" || string(s.Data["token-secret"]) != secret ||
		string(s.Data["expiration"]) != now.Add(3*time.Hour).UTC().Truncate(time.Second).Format(time.RFC3339) {
		t.Errorf("the token's Secret: labels %v, expiration %s", s.Labels, s.Data["expiration"])
	}
	if s.Annotations[kube.SignatureAnnotation] == "" {
		t.Errorf("the token's Secret carries no %s annotation: fleetd's approver would not judge it", kube.SignatureAnnotation)
	}
	a := ie.audit(t, "install")
	if len(a) != 1 || !strings.Contains(a[0].Detail, "Kubernetes bootstrap token "+id+" until") || strings.Contains(a[0].Detail, secret) {
		t.Errorf("audit %+v, want the token's id and not its secret", a)
	}
}

// TestSimInstallRefusedWhenTheClusterIsDown: with [kubernetes] and the API
// server unreachable, the install fails (UNAVAILABLE, retry) before any
// code is issued or config stored.
func TestSimInstallRefusedWhenTheClusterIsDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	ie := newInstallEnv(t, "rack1")
	set := ie.set
	set.KubeTokens = kube.TokenIssuer{Client: client, Signer: ie.auth.JoinSigner, TTL: time.Hour}
	ie.srv.SetInstall(set)
	_, err = ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", time.Minute), ie.m.key, ie.clock.Now()))
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable {
		t.Fatalf("install with the cluster down: %v, want UNAVAILABLE", err)
	}
	if _, err := ie.db.GetConfigRelease(t.Context(), intakeUUID); err == nil {
		t.Error("an install without its bootstrap token stored a release")
	}
	toks, err := ie.db.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range toks {
		if tk.CreatedBy == "install" {
			t.Errorf("an install without its bootstrap token left a join token: %+v", tk)
		}
	}
}
