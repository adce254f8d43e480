package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

const (
	// KubeletClientSigner signs the client certificates of kubelets; the
	// requests for it are the ones the Approver decides.
	KubeletClientSigner = certificatesv1.KubeAPIServerClientKubeletSignerName

	bootstrapUserPrefix = "system:bootstrap:"
	nodeUserPrefix      = "system:node:"
	nodesGroup          = "system:nodes"
	// approvalReason is the reason of the conditions the Approver sets.
	approvalReason = "NodetrustNodeToken"
)

// Outcome is what the Approver did with a request.
type Outcome string

const (
	// Approved: made with the unspent token of exactly the node it names.
	Approved Outcome = "approved"
	// Denied: made with a bootstrap token, but not one that may have it.
	Denied Outcome = "denied"
	// Ignored: not made with a bootstrap token fleetd issued (a kubelet
	// renewing its certificate, another system's token); left pending for
	// whoever decides those.
	Ignored Outcome = "ignored"
)

// Why a request was denied or ignored, for Decision.Reason.
const (
	ReasonNotBootstrap  = "not_bootstrap_user"  // ignored: the requester is no bootstrap token
	ReasonForeignToken  = "foreign_token"       // ignored: a token fleetd did not issue
	ReasonUnsignedToken = "unsigned_token"      // ignored: labelled as fleetd's, without fleetd's valid signature
	ReasonUnknownToken  = "unknown_token"       // denied: no such token (spent, expired, deleted)
	ReasonSpentToken    = "spent_token"         // denied: the token was spent on another request
	ReasonExpiredToken  = "expired_token"       // denied: asked after the token expired
	ReasonWrongNode     = "wrong_node"          // denied: names another node than the token's
	ReasonBadRequest    = "malformed_request"   // denied: not a kubelet client request
	ReasonTokenApproved = "node_token_approved" // approved
)

// Decision is what the Approver decided about one request.
type Decision struct {
	// CSR is the CertificateSigningRequest's name.
	CSR string
	// TokenID is the bootstrap token's id from the requester's username;
	// empty when the requester is no bootstrap token.
	TokenID string
	// Node is the node the token may join as, when the token is fleetd's.
	Node string
	// Requested is the node name the request asks for, when it parsed.
	Requested string
	Outcome   Outcome
	// Reason is one of the Reason constants.
	Reason string
	// Detail says more, for a log; never a secret.
	Detail string
}

// Approver decides kubelet client certificate requests made with
// bootstrap tokens. It is safe to run several (replicas of fleetd): a
// token is marked spent with an update conditional on its version before
// a request is approved.
type Approver struct {
	client kubernetes.Interface
	pub    *ecdsa.PublicKey
	now    func() time.Time
}

// NewApprover returns an Approver that acts through client, which must be
// allowed what deploy/kubernetes/fleetd-rbac.yaml grants, and judges only
// the tokens signed by pub (the public half of fleetd's JoinService
// signing key, which [TokenIssuer] signs with). With a nil pub no token
// is fleetd's, and every request is left pending.
func NewApprover(client kubernetes.Interface, pub *ecdsa.PublicKey) *Approver {
	return &Approver{client: client, pub: pub, now: time.Now}
}

// Sync decides every pending kubelet client request once, and returns
// what it decided. An error means some requests may be left undecided.
func (a *Approver) Sync(ctx context.Context) ([]Decision, error) {
	list, err := a.client.CertificatesV1().CertificateSigningRequests().List(ctx, signerSelector())
	if err != nil {
		return nil, fmt.Errorf("list kubelet certificate requests: %w", err)
	}
	var out []Decision
	var errs []error
	for i := range list.Items {
		d, ok, err := a.Decide(ctx, &list.Items[i])
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			out = append(out, d)
		}
	}
	return out, errors.Join(errs...)
}

// Run decides pending kubelet client requests as they come, until ctx
// ends, calling report with each decision and onError with each error
// (from one goroutine). It lists and then watches, lists again whenever
// the watch ends, and retries a failed list or watch a second later. A
// request it ignores stays pending, so it is reported again on each list
// and each change.
func (a *Approver) Run(ctx context.Context, report func(Decision), onError func(error)) {
	csrs := a.client.CertificatesV1().CertificateSigningRequests()
	for ctx.Err() == nil {
		list, err := csrs.List(ctx, signerSelector())
		if err != nil {
			onError(fmt.Errorf("list kubelet certificate requests: %w", err))
			sleep(ctx, time.Second)
			continue
		}
		for i := range list.Items {
			a.decideAndReport(ctx, &list.Items[i], report, onError)
		}
		opts := signerSelector()
		opts.ResourceVersion = list.ResourceVersion
		w, err := csrs.Watch(ctx, opts)
		if err != nil {
			onError(fmt.Errorf("watch kubelet certificate requests: %w", err))
			sleep(ctx, time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue // Deleted, Bookmark; Error ends the watch and we list again
			}
			if csr, ok := ev.Object.(*certificatesv1.CertificateSigningRequest); ok {
				a.decideAndReport(ctx, csr, report, onError)
			}
		}
		w.Stop()
	}
}

func (a *Approver) decideAndReport(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, report func(Decision), onError func(error)) {
	d, ok, err := a.Decide(ctx, csr)
	if err != nil {
		onError(err)
	}
	if ok {
		report(d)
	}
}

// Decide decides one request: it returns ok false when there was nothing
// to decide (another signer's, or approved or denied already). An error
// means the decision was not carried out (it is retried on the next list).
func (a *Approver) Decide(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (Decision, bool, error) {
	if csr.Spec.SignerName != KubeletClientSigner || decided(csr) {
		return Decision{}, false, nil
	}
	d := Decision{CSR: csr.Name}
	id, ok := strings.CutPrefix(csr.Spec.Username, bootstrapUserPrefix)
	if !ok {
		d.Outcome, d.Reason = Ignored, ReasonNotBootstrap
		d.Detail = "requested by " + csr.Spec.Username
		return d, true, nil
	}
	d.TokenID = id
	secret, err := a.client.CoreV1().Secrets(TokenNamespace).Get(ctx, tokenSecretPrefix+id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && secret.Type != corev1.SecretTypeBootstrapToken) {
		return a.deny(ctx, csr, d, ReasonUnknownToken, "no bootstrap token "+id+": spent, expired or never issued")
	}
	if err != nil {
		return d, false, fmt.Errorf("certificate request %s: read bootstrap token %s: %w", csr.Name, id, err)
	}
	node, ok := secret.Labels[NodeLabel]
	if !ok {
		d.Outcome, d.Reason = Ignored, ReasonForeignToken
		d.Detail = "bootstrap token " + id + " has no " + NodeLabel + " label: not issued by fleetd"
		return d, true, nil
	}
	if !signedByFleetd(a.pub, secret) {
		// Labelled, but not by fleetd: whoever else can write Secrets in
		// kube-system made it. Not fleetd's to approve, nor to deny.
		d.Outcome, d.Reason = Ignored, ReasonUnsignedToken
		d.Detail = "bootstrap token " + id + " is labelled " + NodeLabel + "=" + node + " but has no valid fleetd signature (" + SignatureAnnotation + "): not issued by fleetd"
		return d, true, nil
	}
	d.Node = node
	requested, err := kubeletClientNode(csr)
	if err != nil {
		return a.deny(ctx, csr, d, ReasonBadRequest, err.Error())
	}
	d.Requested = requested
	if spentOn := secret.Annotations[ApprovedAnnotation]; spentOn != "" && spentOn != string(csr.UID) {
		// Spent on another request (perhaps one of the same name, since
		// deleted): the token has done its work, and any use of it now
		// is a replay. Deny, and delete it.
		d, ok, err := a.deny(ctx, csr, d, ReasonSpentToken, "bootstrap token "+id+" was spent on certificate request UID "+spentOn)
		if err != nil {
			return d, ok, err
		}
		if err := a.deleteToken(ctx, secret); err != nil {
			return d, ok, fmt.Errorf("certificate request %s denied, but delete spent bootstrap token %s: %w", csr.Name, id, err)
		}
		return d, ok, nil
	}
	if exp, err := time.Parse(time.RFC3339, string(secret.Data["expiration"])); err != nil || !csr.CreationTimestamp.Time.Before(exp) {
		return a.deny(ctx, csr, d, ReasonExpiredToken, "bootstrap token "+id+" had expired when the request was made")
	}
	if requested != node {
		return a.deny(ctx, csr, d, ReasonWrongNode, fmt.Sprintf("bootstrap token %s is node %s's, the request names node %s", id, node, requested))
	}
	return a.approve(ctx, csr, secret, d)
}

// approve spends the token on csr (a conditional update of its Secret),
// approves csr, then deletes the token.
func (a *Approver) approve(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, secret *corev1.Secret, d Decision) (Decision, bool, error) {
	secrets := a.client.CoreV1().Secrets(TokenNamespace)
	if secret.Annotations[ApprovedAnnotation] != string(csr.UID) {
		spent := secret.DeepCopy()
		if spent.Annotations == nil {
			spent.Annotations = map[string]string{}
		}
		spent.Annotations[ApprovedAnnotation] = string(csr.UID)
		// The update carries the version read: if another approver spent
		// the token meanwhile, it conflicts and the next pass denies.
		if _, err := secrets.Update(ctx, spent, metav1.UpdateOptions{}); err != nil {
			return d, false, fmt.Errorf("certificate request %s: spend bootstrap token %s: %w", csr.Name, d.TokenID, err)
		}
	}
	d.Outcome, d.Reason = Approved, ReasonTokenApproved
	d.Detail = fmt.Sprintf("bootstrap token %s is node %s's", d.TokenID, d.Node)
	if err := a.setCondition(ctx, csr, certificatesv1.CertificateApproved, "nodetrust: "+d.Detail); err != nil {
		return d, false, err
	}
	if err := a.deleteToken(ctx, secret); err != nil {
		// Approved, and the token is marked spent, so no other request can
		// have it; the Secret stays until the next request with it, its
		// expiry or retirement.
		return d, true, fmt.Errorf("certificate request %s approved, but delete bootstrap token %s: %w", csr.Name, d.TokenID, err)
	}
	return d, true, nil
}

// deleteToken deletes the token's Secret if it is still the one read (a
// UID precondition); one already gone is no error.
func (a *Approver) deleteToken(ctx context.Context, secret *corev1.Secret) error {
	uid := secret.UID
	err := a.client.CoreV1().Secrets(TokenNamespace).Delete(ctx, secret.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

func (a *Approver) deny(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, d Decision, reason, detail string) (Decision, bool, error) {
	d.Outcome, d.Reason, d.Detail = Denied, reason, detail
	if err := a.setCondition(ctx, csr, certificatesv1.CertificateDenied, "nodetrust: "+detail); err != nil {
		return d, false, err
	}
	return d, true, nil
}

// setCondition approves or denies csr through its approval subresource.
func (a *Approver) setCondition(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType, message string) error {
	c := csr.DeepCopy()
	c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: typ, Status: corev1.ConditionTrue, Reason: approvalReason, Message: message,
		LastUpdateTime: metav1.NewTime(a.now()),
	})
	if _, err := a.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, c.Name, c, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("certificate request %s: set %s: %w", csr.Name, typ, err)
	}
	return nil
}

// kubeletClientNode checks that csr is a well-formed kubelet client
// request, as the API server's own kubelet client check has it (subject
// system:node:<name> in organisation system:nodes alone, no subject
// alternative names, client authentication), with a valid signature, and
// returns the node name it asks for.
func kubeletClientNode(csr *certificatesv1.CertificateSigningRequest) (string, error) {
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return "", errors.New("the request is not a PEM certificate request")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("parse the certificate request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return "", fmt.Errorf("the certificate request's signature: %w", err)
	}
	node, ok := strings.CutPrefix(req.Subject.CommonName, nodeUserPrefix)
	if !ok || node == "" {
		return "", fmt.Errorf("the subject's common name %q is not %s<node>", req.Subject.CommonName, nodeUserPrefix)
	}
	if !slices.Equal(req.Subject.Organization, []string{nodesGroup}) {
		return "", fmt.Errorf("the subject's organisations %q are not exactly %s", req.Subject.Organization, nodesGroup)
	}
	if len(req.DNSNames)+len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs) > 0 {
		return "", errors.New("a kubelet client request carries no subject alternative names")
	}
	client := false
	for _, u := range csr.Spec.Usages {
		switch u {
		case certificatesv1.UsageClientAuth:
			client = true
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment:
		default:
			return "", fmt.Errorf("usage %q is not a kubelet client's", u)
		}
	}
	if !client {
		return "", errors.New("the request does not ask for client authentication")
	}
	return node, nil
}

// decided reports whether csr was approved or denied already, or failed.
func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			return true
		}
	}
	return false
}

func signerSelector() metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: "spec.signerName=" + KubeletClientSigner}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
