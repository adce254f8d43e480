package fleetd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodetrust/nodetrust/internal/fleetd/actuator"
	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube/kubetest"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/pki"
)

// Each test starts its own control plane (no kubetest.Main), so that the
// fixed names of its objects hold under -count=N.

// kubeWaitTimeout bounds each wait for the cluster to act.
const kubeWaitTimeout = time.Minute

// writeKubeconfig writes cfg (a bearer token's) as a kubeconfig file of
// the given mode.
func writeKubeconfig(t *testing.T, dir string, cfg *rest.Config, mode os.FileMode) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "x"
	p := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, p); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// loadKubeConfig writes a fleetd.toml naming kubeconfig in dir and loads it.
func loadKubeConfig(t *testing.T, dir, extra string) *config.Fleetd {
	t.Helper()
	p := filepath.Join(dir, "fleetd.toml")
	text := "pki_dir = \"pki\"\ndata_dir = \"data\"\n" + extra + "[kubernetes]\nkubeconfig = \"kubeconfig\"\ndrain_timeout = \"1m\"\nretire_retry = \"1s\"\n"
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadFleetd(p)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// bootstrapCSR makes, with bearer, a kubelet client request for node as a
// kubelet does. The API server learns of a new token a moment after it is
// created, with no signal to wait for: Unauthorized is retried while
// retryUnauthorized holds, within kubeWaitTimeout.
func bootstrapCSR(t *testing.T, c *kubetest.Cluster, bearer, node string, retryUnauthorized bool) (*certificatesv1.CertificateSigningRequest, error) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(c.BearerConfig(bearer))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(kubeWaitTimeout)
	for {
		csr, err := cs.CertificatesV1().CertificateSigningRequests().Create(t.Context(), &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
			Spec: certificatesv1.CertificateSigningRequestSpec{
				Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
				SignerName: kube.KubeletClientSigner,
				Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
			},
		}, metav1.CreateOptions{})
		if err == nil || !retryUnauthorized || !apierrors.IsUnauthorized(err) || time.Now().After(deadline) {
			return csr, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitCSRDecided watches the request until it is approved or denied, and
// says which.
func waitCSRDecided(t *testing.T, admin kubernetes.Interface, name string) certificatesv1.RequestConditionType {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeWaitTimeout)
	defer cancel()
	w, err := admin.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		csr, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
		if !ok {
			continue
		}
		for _, c := range csr.Status.Conditions {
			if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
				return c.Type
			}
		}
	}
	t.Fatalf("request %s was not decided: %v", name, context.Cause(ctx))
	return ""
}

// applyManifests applies deploy/kubernetes and returns a client
// configuration of fleetd's ServiceAccount.
func applyManifests(t *testing.T, c *kubetest.Cluster) *rest.Config {
	t.Helper()
	for _, name := range []string{"fleetd.yaml", "node-bootstrap.yaml", "admission.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Apply(t.Context(), b); err != nil {
			t.Fatal(err)
		}
	}
	sa, err := c.ServiceAccountConfig(t.Context(), "nodetrust", "fleetd")
	if err != nil {
		t.Fatal(err)
	}
	return sa
}

// testJoinKey stands for fleetd's JoinService signing key where a test
// runs the approver and the token issuer without a whole fleetd.
var testJoinKey = func() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}()

// TestServeRunsTheApprover: Run with [kubernetes] starts the approver,
// which approves a node's own request in a real API server, and stops
// with Run.
func TestServeRunsTheApprover(t *testing.T) {
	c := kubetest.Start(t)
	sa := applyManifests(t, c)
	dir := t.TempDir()
	for _, d := range []string{"pki", "data"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pki.Init(filepath.Join(dir, "pki"), pki.InitOptions{TrustDomain: "example.test", ServerName: "localhost"}); err != nil {
		t.Fatal(err)
	}
	auth, err := pki.LoadAuthority(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	writeKubeconfig(t, dir, sa, 0o600)
	cfg := loadKubeConfig(t, dir, "listen = \"127.0.0.1:0\"\n[actuator]\nkind = \"kubernetes\"\n")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Config: cfg, Ready: func(string, string) { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("fleetd did not start: %v", err)
	}
	_, bearer, _, err := kube.TokenIssuer{Client: c.Admin(t), Signer: auth.JoinSigner, TTL: time.Hour}.IssueBootstrapToken(t.Context(), "serve-a", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	csr, err := bootstrapCSR(t, c, bearer, "serve-a", true)
	if err != nil {
		t.Fatal(err)
	}
	if got := waitCSRDecided(t, c.Admin(t), csr.Name); got != certificatesv1.CertificateApproved {
		t.Fatalf("the node's own request was %s by fleetd serve", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("fleetd stopped with %v", err)
	}
}

// TestKubernetesWiring: with [kubernetes] and [actuator] kind =
// "kubernetes", fleetd's pieces act on a real API server as fleetd's
// ServiceAccount, through the kubeconfig file: the approver running as in
// fleetd serve approves a node's own request once and counts it; the
// cordon actuator cordons a quarantined worker, not a control-plane
// machine, and release uncordons; a retirement drains the Node (kwok
// runs its pod), deletes it and the node's token.
func TestKubernetesWiring(t *testing.T) {
	c := kubetest.Start(t)
	ctx := t.Context()
	admin := c.Admin(t)
	sa := applyManifests(t, c)
	dir := t.TempDir()
	writeKubeconfig(t, dir, sa, 0o644)
	cfg := loadKubeConfig(t, dir, "[actuator]\nkind = \"kubernetes\"\n")
	if _, err := openKubernetes(cfg, nil, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a kubeconfig others may read: %v, want a refusal saying chmod 600", err)
	}
	writeKubeconfig(t, dir, sa, 0o600)
	kw, err := openKubernetes(cfg, nil, slog.New(slog.DiscardHandler))
	if err != nil || kw == nil || kw.cordoner == nil {
		t.Fatalf("open [kubernetes]: %v, %v", kw, err)
	}
	kw.retirer.register(prometheus.NewRegistry())

	t.Run("approver", func(t *testing.T) {
		m := newApproverMetrics(prometheus.NewRegistry())
		actx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			runApprover(actx, kube.NewApprover(kw.client, &testJoinKey.PublicKey), m, slog.New(slog.DiscardHandler))
			close(done)
		}()
		tokens := kube.TokenIssuer{Client: kw.client, Signer: testJoinKey, TTL: cfg.Kubernetes.TokenLifetime.Duration}
		id, bearer, _, err := tokens.IssueBootstrapToken(ctx, "wire-a", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		csr, err := bootstrapCSR(t, c, bearer, "wire-a", true)
		if err != nil {
			t.Fatal(err)
		}
		if got := waitCSRDecided(t, admin, csr.Name); got != certificatesv1.CertificateApproved {
			t.Fatalf("the node's own request was %s", got)
		}
		// The token is spent: a second request is refused by the API
		// server (the token is gone) or, within its cache's seconds,
		// denied.
		if again, err := bootstrapCSR(t, c, bearer, "wire-a", false); err == nil {
			if got := waitCSRDecided(t, admin, again.Name); got != certificatesv1.CertificateDenied {
				t.Fatalf("a second request with the spent token was %s", got)
			}
		} else if !apierrors.IsUnauthorized(err) {
			t.Fatal(err)
		}
		stop()
		<-done
		if n := testutil.ToFloat64(m.decisions.WithLabelValues("approved")); n != 1 {
			t.Errorf("approved decisions counted: %v, want 1", n)
		}
		if _, err := admin.CoreV1().Secrets(kube.TokenNamespace).Get(ctx, "bootstrap-token-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the spent token: %v, want it deleted", err)
		}
	})

	t.Run("cordon", func(t *testing.T) {
		nodes := admin.CoreV1().Nodes()
		for _, n := range []string{"wire-worker", "wire-cp"} {
			if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		cordoned := func(name string) bool {
			n, err := nodes.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return n.Spec.Unschedulable
		}
		var a actuator.Actuator = kw.cordoner
		if err := a.Cordon(ctx, actuator.Cordon{NodeID: "wire-worker", Class: "worker", RequestID: "r1"}); err != nil || !cordoned("wire-worker") {
			t.Fatalf("the quarantined worker: %v, cordoned %v", err, cordoned("wire-worker"))
		}
		if err := a.Cordon(ctx, actuator.Cordon{NodeID: "wire-cp", Class: "control-plane"}); !errors.Is(err, kube.ErrControlPlane) || cordoned("wire-cp") {
			t.Fatalf("a control-plane machine with a failed verdict: %v, cordoned %v", err, cordoned("wire-cp"))
		}
		var rel lifecycle.ReleaseHook = kw.cordoner
		if err := rel.Released(ctx, store.Node{ID: "wire-worker"}, "checked"); err != nil || cordoned("wire-worker") {
			t.Fatalf("release: %v, still cordoned %v", err, cordoned("wire-worker"))
		}
	})

	t.Run("retirement", func(t *testing.T) {
		c.StartKwok(t)
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wire-r"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "wire-r-app", Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "wire-r", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app"}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		id, _, _, err := kube.TokenIssuer{Client: kw.client, Signer: testJoinKey, TTL: time.Hour}.IssueBootstrapToken(ctx, "wire-r", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := kw.retirer.Retired(ctx, store.Node{ID: "wire-r"}, "end of life"); err != nil {
			t.Fatal(err)
		}
		if left := kw.retirer.runQueue(ctx); left != 0 {
			t.Fatalf("%d removals left after a run", left)
		}
		if _, err := admin.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the pod after retirement: %v, want it evicted and gone", err)
		}
		if _, err := admin.CoreV1().Nodes().Get(ctx, "wire-r", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the Node after retirement: %v, want it deleted", err)
		}
		if _, err := admin.CoreV1().Secrets(kube.TokenNamespace).Get(ctx, "bootstrap-token-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the token after retirement: %v, want it deleted", err)
		}
		if n := testutil.ToFloat64(kw.retirer.outcomes.WithLabelValues("done")); n != 1 {
			t.Errorf("removals done counted: %v, want 1", n)
		}
	})
}

// TestRetirementSweepAfterARestart: the sweep queues a Node and a token
// named as a node the store says is retired (a removal a restart of fleetd
// forgot), and only those: an active node's Node and a Node fleetd never
// heard of stay.
func TestRetirementSweepAfterARestart(t *testing.T) {
	c := kubetest.Start(t)
	ctx := t.Context()
	admin := c.Admin(t)
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "fleetd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now()
	for _, id := range []string{"sweep-old", "sweep-gone", "sweep-alive"} {
		if err := db.CompleteJoin(ctx, store.Join{Now: now, Node: store.Node{ID: id, State: store.StateActive, Generation: 1},
			Cert: store.Cert{Serial: "s-" + id, NodeID: id, Generation: 1, Kind: "join", IssuedAt: now, NotAfter: now.Add(time.Hour)}}); err != nil {
			t.Fatal(err)
		}
	}
	m := &lifecycle.Manager{Store: db}
	for _, id := range []string{"sweep-old", "sweep-gone"} {
		if _, err := m.Retire(ctx, id, "admin:op", "end of life", ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"sweep-old", "sweep-alive", "sweep-stranger"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// sweep-gone has no Node left, but a token.
	tok, err := kube.IssueBootstrapToken(ctx, admin, testJoinKey, "sweep-gone", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	r := &kubeRetirer{client: admin, nodes: db, log: slog.New(slog.DiscardHandler), retry: time.Second}
	r.register(prometheus.NewRegistry())
	if err := r.sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if left := r.runQueue(ctx); left != 0 {
		t.Fatalf("%d removals left", left)
	}
	if n := testutil.ToFloat64(r.outcomes.WithLabelValues("done")); n != 2 {
		t.Errorf("removals done: %v, want 2 (sweep-old, sweep-gone)", n)
	}
	if _, err := admin.CoreV1().Nodes().Get(ctx, "sweep-old", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the retired node's Node: %v, want it deleted", err)
	}
	if _, err := admin.CoreV1().Secrets(kube.TokenNamespace).Get(ctx, "bootstrap-token-"+tok.ID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the retired node's token: %v, want it deleted", err)
	}
	for _, n := range []string{"sweep-alive", "sweep-stranger"} {
		if _, err := admin.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{}); err != nil {
			t.Errorf("Node %s: %v, want it kept", n, err)
		}
	}
}

// TestRetirementWithTheClusterDown: a retirement returns at once with the
// API server unreachable; its removal from the cluster fails, is counted,
// and stays queued for the next try.
func TestRetirementWithTheClusterDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	dir := t.TempDir()
	writeKubeconfig(t, dir, &rest.Config{Host: "https://" + addr, BearerToken: "not-a-real-token"}, 0o600)
	cfg := loadKubeConfig(t, dir, "")
	kw, err := openKubernetes(cfg, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if kw.cordoner != nil {
		t.Error("a cordon actuator without [actuator] kind = \"kubernetes\"")
	}
	kw.retirer.register(prometheus.NewRegistry())
	if err := kw.retirer.Retired(t.Context(), store.Node{ID: "down-01"}, "end of life"); err != nil {
		t.Fatalf("the retirement hook: %v, want the removal queued", err)
	}
	if left := kw.retirer.runQueue(t.Context()); left != 1 {
		t.Fatalf("%d removals left with the cluster down, want 1", left)
	}
	if n := testutil.ToFloat64(kw.retirer.outcomes.WithLabelValues("failed")); n != 1 {
		t.Errorf("failed removals counted: %v, want 1", n)
	}
	if n := testutil.ToFloat64(kw.retirer.pending); n != 1 {
		t.Errorf("pending removals: %v, want 1", n)
	}
}
