package kube_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodetrust/nodetrust/internal/fleetd/kube"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// joinKey stands for fleetd's JoinService signing key: it signs the
// tokens the tests issue, and the approvers check its public half.
var joinKey = func() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}()

// newRunID returns 5 random characters that make the names of the objects
// a test creates in the shared cluster unique to this run of it, so that
// -count=N works.
func newRunID() string {
	b := make([]byte, 5)
	for i := range b {
		var c [1]byte
		_, _ = rand.Read(c[:])
		b[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[int(c[0])%36]
	}
	return string(b)
}

// waitTimeout bounds each wait for the cluster to act (a signature, a
// policy taking effect): well above what it takes here.
const waitTimeout = time.Minute

// manifests are deploy/kubernetes's, in the order they must be applied.
var manifests = []string{"fleetd.yaml", "node-bootstrap.yaml", "admission.yaml"}

var setupOnce struct {
	sync.Once
	fleetd kubernetes.Interface
	err    error
}

// env is the shared cluster with deploy/kubernetes applied.
type env struct {
	c      *kubetest.Cluster
	admin  kubernetes.Interface
	fleetd kubernetes.Interface // as the ServiceAccount nodetrust/fleetd
}

// setup starts (or reuses) the cluster and applies the manifests once,
// then waits until the admission policies are in force.
func setup(t *testing.T) env {
	t.Helper()
	c := kubetest.Start(t)
	e := env{c: c, admin: c.Admin(t)}
	setupOnce.Do(func() {
		setupOnce.fleetd, setupOnce.err = applyManifests(t, c, e.admin)
	})
	if setupOnce.err != nil {
		t.Fatal(setupOnce.err)
	}
	e.fleetd = setupOnce.fleetd
	return e
}

func applyManifests(t *testing.T, c *kubetest.Cluster, admin kubernetes.Interface) (kubernetes.Interface, error) {
	ctx := t.Context()
	for _, name := range manifests {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "kubernetes", name))
		if err != nil {
			return nil, err
		}
		if err := c.Apply(ctx, b); err != nil {
			return nil, err
		}
	}
	cfg, err := c.ServiceAccountConfig(ctx, "nodetrust", "fleetd")
	if err != nil {
		return nil, err
	}
	fleetd, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// Admission policies take effect a moment after they are created: a
	// dry-run Secret that fleetd may not write is the signal.
	probe := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "nodetrust-policy-probe", Namespace: kube.TokenNamespace}}
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	for {
		_, err := fleetd.CoreV1().Secrets(kube.TokenNamespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			if strings.Contains(err.Error(), "fleetd writes only the bootstrap tokens") {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fleetd, nil
}

// kubeletCSR creates, as the holder of bearer, a kubelet client
// certificate request for node, as a kubelet does; err is the API
// server's answer.
func kubeletCSR(t *testing.T, e env, bearer, node string) (*certificatesv1.CertificateSigningRequest, *ecdsa.PrivateKey, error) {
	t.Helper()
	return namedCSR(t, e, bearer, node, "")
}

// namedCSR is kubeletCSR with the request's name (a generated one when
// empty).
func namedCSR(t *testing.T, e env, bearer, node, name string) (*certificatesv1.CertificateSigningRequest, *ecdsa.PrivateKey, error) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(e.c.BearerConfig(bearer))
	if err != nil {
		t.Fatal(err)
	}
	csr, err := cs.CertificatesV1().CertificateSigningRequests().Create(t.Context(), &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, GenerateName: "node-csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: kube.KubeletClientSigner,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{})
	return csr, key, err
}

// mustCSR is kubeletCSR with a token that must be accepted. The API server
// reads bootstrap tokens from a cache of Secrets, which learns of a new one
// a moment after it is created, with no signal to wait for: an
// Unauthorized answer is retried, within waitTimeout.
func mustCSR(t *testing.T, e env, bearer, node string) (*certificatesv1.CertificateSigningRequest, *ecdsa.PrivateKey) {
	t.Helper()
	return mustNamedCSRKey(t, e, bearer, node, "")
}

// mustNamedCSR is mustCSR with the request's name.
func mustNamedCSR(t *testing.T, e env, bearer, node, name string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	csr, _ := mustNamedCSRKey(t, e, bearer, node, name)
	return csr
}

func mustNamedCSRKey(t *testing.T, e env, bearer, node, name string) (*certificatesv1.CertificateSigningRequest, *ecdsa.PrivateKey) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		csr, key, err := namedCSR(t, e, bearer, node, name)
		if err == nil {
			return csr, key
		}
		if !apierrors.IsUnauthorized(err) || time.Now().After(deadline) {
			t.Fatalf("create a kubelet certificate request for %s with a bootstrap token: %v", node, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// decisionFor runs the approver once and returns its decision about csr.
func decisionFor(t *testing.T, a *kube.Approver, csr string) kube.Decision {
	t.Helper()
	ds, err := a.Sync(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.CSR == csr {
			return d
		}
	}
	t.Fatalf("no decision about %s among %+v", csr, ds)
	return kube.Decision{}
}

func conditions(t *testing.T, e env, name string) (approved, denied bool, cert []byte) {
	t.Helper()
	csr, err := e.admin.CertificatesV1().CertificateSigningRequests().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range csr.Status.Conditions {
		approved = approved || c.Type == certificatesv1.CertificateApproved
		denied = denied || c.Type == certificatesv1.CertificateDenied
	}
	return approved, denied, csr.Status.Certificate
}

// waitSigned watches csr until the controller manager has signed it.
func waitSigned(t *testing.T, e env, name string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	csrs := e.admin.CertificatesV1().CertificateSigningRequests()
	w, err := csrs.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if csr, ok := ev.Object.(*certificatesv1.CertificateSigningRequest); ok && len(csr.Status.Certificate) > 0 {
			return csr.Status.Certificate
		}
	}
	t.Fatalf("certificate request %s was not signed: %v; the controller manager's log ends:\n%s", name, context.Cause(ctx), e.c.LogTail("kube-controller-manager"))
	return nil
}

func tokenExists(t *testing.T, e env, id string) bool {
	t.Helper()
	_, err := e.admin.CoreV1().Secrets(kube.TokenNamespace).Get(t.Context(), "bootstrap-token-"+id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// TestTokenJoinsOnlyItsOwnNodeOnce is seed 003's row "Join under another
// node's name with a bootstrap token", against a real API server and
// controller manager: node A's token cannot get a certificate for node B;
// A's own request is approved once and signed; a second request with the
// same token is not approved; the token is gone.
func TestTokenJoinsOnlyItsOwnNodeOnce(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	a := kube.NewApprover(e.fleetd, &joinKey.PublicKey)
	tokA, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, "node-a", 4*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, "node-b", 4*time.Hour, time.Now()); err != nil {
		t.Fatal(err)
	}

	// A's token asks for B's name: denied, and A's token is not spent.
	forB, _ := mustCSR(t, e, tokA.Bearer(), "node-b")
	if forB.Spec.Username != "system:bootstrap:"+tokA.ID {
		t.Fatalf("the request's username is %q, want system:bootstrap:%s", forB.Spec.Username, tokA.ID)
	}
	d := decisionFor(t, a, forB.Name)
	if d.Outcome != kube.Denied || d.Reason != kube.ReasonWrongNode || d.Node != "node-a" || d.Requested != "node-b" {
		t.Fatalf("A's token asking for node-b: %+v, want denied as wrong_node", d)
	}
	if approved, denied, cert := conditions(t, e, forB.Name); approved || !denied || len(cert) > 0 {
		t.Fatalf("A's request for node-b: approved %v, denied %v, certificate %d bytes; want denied only", approved, denied, len(cert))
	}
	if !tokenExists(t, e, tokA.ID) {
		t.Fatal("a denied request spent A's token")
	}

	// A's own request: approved, signed for system:node:node-a, token gone.
	own, key := mustCSR(t, e, tokA.Bearer(), "node-a")
	d = decisionFor(t, a, own.Name)
	if d.Outcome != kube.Approved || d.Node != "node-a" || d.TokenID != tokA.ID {
		t.Fatalf("A's own request: %+v, want approved", d)
	}
	certPEM := waitSigned(t, e, own.Name)
	if tokenExists(t, e, tokA.ID) {
		t.Fatal("A's token still exists after its request was approved")
	}
	// The certificate authenticates as node A.
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	nodeA, err := kubernetes.NewForConfig(e.c.CertConfig(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	if err != nil {
		t.Fatal(err)
	}
	who, err := nodeA.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if who.Status.UserInfo.Username != "system:node:node-a" {
		t.Fatalf("the signed certificate authenticates as %q, want system:node:node-a", who.Status.UserInfo.Username)
	}

	// A second request with the same token. The API server may still
	// accept the deleted token for a few seconds (its cache): then the
	// request exists and must be denied; after that it is refused.
	again, _, err := kubeletCSR(t, e, tokA.Bearer(), "node-a")
	switch {
	case apierrors.IsUnauthorized(err):
		t.Log("a second request with the spent token: unauthorized")
	case err != nil:
		t.Fatalf("a second request with A's spent token: %v, want accepted (cache) or unauthorized", err)
	default:
		d = decisionFor(t, a, again.Name)
		if d.Outcome != kube.Denied || d.Reason != kube.ReasonUnknownToken {
			t.Fatalf("a second request with A's spent token: %+v, want denied as unknown_token", d)
		}
		if approved, _, _ := conditions(t, e, again.Name); approved {
			t.Fatal("a second request with A's spent token was approved")
		}
		t.Log("a second request with the spent token: accepted (the API server's token cache), denied as unknown_token")
	}
}

// TestOnlyFleetdMayApproveBootstrapRequests: with the admission policy in
// force, not even a cluster administrator (nor the controller manager)
// can approve a kubelet certificate requested with a bootstrap token;
// fleetd can, for the token's node.
func TestOnlyFleetdMayApproveBootstrapRequests(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	tok, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, "node-c", 4*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	csr, _ := mustCSR(t, e, tok.Bearer(), "node-c")
	// The controller manager's certificate controllers act as this
	// ServiceAccount, which RBAC lets approve kubelet client requests.
	// The controller manager creates it as it starts its controllers.
	var kcm *rest.Config
	deadline := time.Now().Add(waitTimeout)
	for {
		kcm, err = e.c.ServiceAccountConfig(ctx, "kube-system", "certificate-controller")
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for who, cfg := range map[string]*rest.Config{"the administrator": e.c.AdminConfig(), "the controller manager": kcm} {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c := csr.DeepCopy()
		c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ByHand",
		})
		_, err = cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, c.Name, c, metav1.UpdateOptions{})
		if err == nil {
			t.Fatalf("%s approved a bootstrap request", who)
		}
		// Both pass RBAC: the policy is what refuses them.
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only nodetrust fleetd approves") {
			t.Fatalf("%s approving a bootstrap request: %v, want refused by the admission policy", who, err)
		}
		t.Logf("%s: %v", who, err)
	}
	if approved, _, _ := conditions(t, e, csr.Name); approved {
		t.Fatal("the request is approved")
	}
	if d := decisionFor(t, kube.NewApprover(e.fleetd, &joinKey.PublicKey), csr.Name); d.Outcome != kube.Approved {
		t.Fatalf("fleetd's decision: %+v, want approved", d)
	}
	waitSigned(t, e, csr.Name)
}

// TestForeignTokenIsLeftPending: a bootstrap token fleetd did not issue
// (no node label) is not fleetd's to judge: its request is ignored, left
// pending, and its token kept.
func TestForeignTokenIsLeftPending(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	id := "f" + newRunID()
	_, err := e.admin.CoreV1().Secrets(kube.TokenNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: kube.TokenNamespace},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": id, "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true",
			"auth-extra-groups": kube.BootstrapGroup,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	csr, _ := mustCSR(t, e, id+".0123456789abcdef", "node-f")
	d := decisionFor(t, kube.NewApprover(e.fleetd, &joinKey.PublicKey), csr.Name)
	if d.Outcome != kube.Ignored || d.Reason != kube.ReasonForeignToken {
		t.Fatalf("a foreign token's request: %+v, want ignored as foreign_token", d)
	}
	if approved, denied, _ := conditions(t, e, csr.Name); approved || denied {
		t.Fatalf("a foreign token's request: approved %v, denied %v; want pending", approved, denied)
	}
	if !tokenExists(t, e, id) {
		t.Fatal("the foreign token was deleted")
	}
}

// TestRunDecidesAsRequestsCome: the watching approver approves a request
// made after it started.
func TestRunDecidesAsRequestsCome(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	decisions := make(chan kube.Decision, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		kube.NewApprover(e.fleetd, &joinKey.PublicKey).Run(ctx, func(d kube.Decision) { decisions <- d }, func(err error) { t.Log(err) })
	}()
	defer func() { cancel(); <-done }()
	tok, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, "node-r", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	csr, _ := mustCSR(t, e, tok.Bearer(), "node-r")
	timeout := time.After(waitTimeout)
	for {
		select {
		case d := <-decisions:
			if d.CSR != csr.Name {
				continue
			}
			if d.Outcome != kube.Approved {
				t.Fatalf("the watching approver: %+v, want approved", d)
			}
			waitSigned(t, e, csr.Name)
			return
		case <-timeout:
			t.Fatalf("the watching approver decided nothing about %s", csr.Name)
		}
	}
}

// TestFleetdWritesOnlyItsTokens: the admission policy keeps fleetd's
// Secret writes in kube-system to the tokens it issues.
func TestFleetdWritesOnlyItsTokens(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	runID := newRunID()
	_, err := e.fleetd.CoreV1().Secrets(kube.TokenNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "not-a-token-" + runID, Namespace: kube.TokenNamespace},
		StringData: map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "fleetd writes only the bootstrap tokens") {
		t.Fatalf("fleetd creating an Opaque Secret in kube-system: %v, want refused by the policy", err)
	}
	if _, err := e.admin.CoreV1().Secrets(kube.TokenNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "someone-elses-" + runID, Namespace: kube.TokenNamespace},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = e.fleetd.CoreV1().Secrets(kube.TokenNamespace).Delete(ctx, "someone-elses-"+runID, metav1.DeleteOptions{})
	if err == nil || !strings.Contains(err.Error(), "fleetd changes or deletes only") {
		t.Fatalf("fleetd deleting another Secret in kube-system: %v, want refused by the policy", err)
	}
	// Its own tokens it issues and deletes.
	if _, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, "node-x-"+runID, time.Hour, time.Now()); err != nil {
		t.Fatal(err)
	}
	if n, err := kube.DeleteBootstrapTokens(ctx, e.fleetd, "node-x-"+runID); err != nil || n != 1 {
		t.Fatalf("DeleteBootstrapTokens(node-x) = %d, %v; want 1 deleted", n, err)
	}
}

// forgeToken creates, as the administrator (standing for whoever else may
// write Secrets in kube-system), a bootstrap token labelled as node's
// with the given signature annotation (none when empty), and returns its
// bearer form.
func forgeToken(t *testing.T, e env, node, sig string) (id, bearer string) {
	t.Helper()
	id = "g" + newRunID()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: kube.TokenNamespace,
			Labels: map[string]string{kube.NodeLabel: node}},
		Type: corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": id, "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true",
			"auth-extra-groups": kube.BootstrapGroup,
			"expiration":        time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		},
	}
	if sig != "" {
		s.Annotations = map[string]string{kube.SignatureAnnotation: sig}
	}
	if _, err := e.admin.CoreV1().Secrets(kube.TokenNamespace).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return id, id + ".0123456789abcdef"
}

// TestLabelledTokenWithoutFleetdsSignatureIsLeftPending: a token labelled
// nodetrust.io/node by someone else (no signature, a signature copied
// from one of fleetd's tokens, or one by another key) is never approved:
// its request is ignored as unsigned_token and left pending, its token
// kept; fleetd's own token, issued meanwhile, still is approved.
func TestLabelledTokenWithoutFleetdsSignatureIsLeftPending(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	a := kube.NewApprover(e.fleetd, &joinKey.PublicKey)
	own, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, "node-s", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ownSecret, err := e.admin.CoreV1().Secrets(kube.TokenNamespace).Get(ctx, "bootstrap-token-"+own.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherTok, err := kube.IssueBootstrapToken(ctx, e.admin, otherKey, "node-s", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, noSig := forgeToken(t, e, "node-s", "")
	_, copied := forgeToken(t, e, "node-s", ownSecret.Annotations[kube.SignatureAnnotation])
	for name, bearer := range map[string]string{"no signature": noSig, "fleetd's signature of another token": copied,
		"another key's signature": otherTok.Bearer()} {
		id, _, _ := strings.Cut(bearer, ".")
		csr, _ := mustCSR(t, e, bearer, "node-s")
		d := decisionFor(t, a, csr.Name)
		if d.Outcome != kube.Ignored || d.Reason != kube.ReasonUnsignedToken {
			t.Errorf("%s: %+v, want ignored as unsigned_token", name, d)
		}
		if approved, denied, _ := conditions(t, e, csr.Name); approved || denied {
			t.Errorf("%s: approved %v, denied %v; want pending", name, approved, denied)
		}
		if !tokenExists(t, e, id) {
			t.Errorf("%s: the token was deleted", name)
		}
	}
	csr, _ := mustCSR(t, e, own.Bearer(), "node-s")
	if d := decisionFor(t, a, csr.Name); d.Outcome != kube.Approved {
		t.Fatalf("fleetd's own token: %+v, want approved", d)
	}
	waitSigned(t, e, csr.Name)
}

// TestSpentTokenIsNotSpentAgainUnderTheSameName: a request approved, then
// deleted (as the controller manager's cleaner does), and made again
// under the same name with the same token, which fleetd crashed before
// deleting (here put back as it was left: marked spent on the first
// request), is another request: denied as spent_token, and the token
// deleted.
func TestSpentTokenIsNotSpentAgainUnderTheSameName(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	a := kube.NewApprover(e.fleetd, &joinKey.PublicKey)
	tok, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, "node-u", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	secrets := e.admin.CoreV1().Secrets(kube.TokenNamespace)
	issued, err := secrets.Get(ctx, "bootstrap-token-"+tok.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name := "node-csr-same-" + newRunID()
	first := mustNamedCSR(t, e, tok.Bearer(), "node-u", name)
	if d := decisionFor(t, a, first.Name); d.Outcome != kube.Approved {
		t.Fatalf("the first request: %+v, want approved", d)
	}
	waitSigned(t, e, first.Name)
	if tokenExists(t, e, tok.ID) {
		t.Fatal("the token still exists after its request was approved")
	}

	// What a fleetd that crashed between the approval and the delete
	// leaves: the token, marked spent on the first request.
	left := issued.DeepCopy()
	left.ResourceVersion, left.UID, left.CreationTimestamp = "", "", metav1.Time{}
	left.Annotations[kube.ApprovedAnnotation] = string(first.UID)
	if _, err := secrets.Create(ctx, left, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.admin.CertificatesV1().CertificateSigningRequests().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := mustNamedCSR(t, e, tok.Bearer(), "node-u", name)
	if again.UID == first.UID {
		t.Fatal("the request made again has the first one's UID")
	}
	d := decisionFor(t, a, name)
	if d.Outcome != kube.Denied || d.Reason != kube.ReasonSpentToken {
		t.Fatalf("a request of the same name with the spent token: %+v, want denied as spent_token", d)
	}
	if approved, denied, _ := conditions(t, e, name); approved || !denied {
		t.Fatalf("a request of the same name with the spent token: approved %v, denied %v; want denied", approved, denied)
	}
	if tokenExists(t, e, tok.ID) {
		t.Fatal("the spent token, met again, was not deleted")
	}
}

// TestIssuerKeepsOneTokenPerNode: issuing a node's token again (an
// install run again) deletes the node's earlier tokens, and no other
// node's.
func TestIssuerKeepsOneTokenPerNode(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	runID := newRunID()
	issuer := kube.TokenIssuer{Client: e.fleetd, Signer: joinKey, TTL: time.Hour}
	first, _, _, err := issuer.IssueBootstrapToken(ctx, "node-o-"+runID, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	other, _, _, err := issuer.IssueBootstrapToken(ctx, "node-p-"+runID, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	second, _, _, err := issuer.IssueBootstrapToken(ctx, "node-o-"+runID, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if tokenExists(t, e, first) {
		t.Error("the node's earlier token is still there after it was issued a new one")
	}
	if !tokenExists(t, e, second) {
		t.Error("the node's new token is not there")
	}
	if !tokenExists(t, e, other) {
		t.Error("issuing one node's token deleted another node's")
	}
}
