package kube

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/nodetrust/nodetrust/pki"
)

const (
	// TokenNamespace is where the API server looks up bootstrap tokens.
	TokenNamespace = "kube-system"
	// NodeLabel labels a bootstrap token's Secret with the name of the one
	// node it may join as.
	NodeLabel = "nodetrust.io/node"
	// ApprovedAnnotation on a token's Secret holds the UID of the
	// certificate request the token was spent on, set before the approval
	// so that a token is spent once even with several approvers. A UID,
	// not a name: a request deleted and made again under the same name is
	// another request.
	ApprovedAnnotation = "nodetrust.io/approved-csr-uid"
	// SignatureAnnotation on a token's Secret is fleetd's signature of it:
	// base64 of an ECDSA P1363 signature by the JoinService signing key
	// over tokenDigest. A labelled token without a valid one was not
	// issued by fleetd, and the Approver leaves its requests alone.
	SignatureAnnotation = "nodetrust.io/signature"
	// BootstrapGroup is the extra group of every token fleetd issues; the
	// manifests in deploy/kubernetes let it create certificate requests
	// and nothing else.
	BootstrapGroup = "system:bootstrappers:nodetrust:nodes"

	// The bootstrap token format (Kubernetes' cluster-bootstrap): a Secret
	// "bootstrap-token-<id>" of type bootstrap.kubernetes.io/token.
	tokenSecretPrefix = "bootstrap-token-"
	tokenIDLen        = 6
	tokenSecretLen    = 16
	tokenAlphabet     = "abcdefghijklmnopqrstuvwxyz0123456789"
)

// BootstrapToken is a node's own bootstrap token. Its String never shows
// the secret; [BootstrapToken.Bearer] is the only way to it.
type BootstrapToken struct {
	// ID is the public part, in the Secret's name and in the username
	// (system:bootstrap:<id>) the API server gives whoever presents it.
	ID string
	// Node is the one node the token may join as.
	Node string
	// Expires is when the API server stops accepting it.
	Expires time.Time

	secret string
}

// Bearer returns the token as a kubelet presents it, "<id>.<secret>": for
// the worker's rendered config only, never a log.
func (t BootstrapToken) Bearer() string { return t.ID + "." + t.secret }

// String names the token without its secret.
func (t BootstrapToken) String() string {
	return fmt.Sprintf("bootstrap token %s for node %s", t.ID, t.Node)
}

// GoString is String, so that %#v does not print the secret either.
func (t BootstrapToken) GoString() string { return t.String() }

// tokenDigest is what fleetd signs of a token it issues: SHA-256 of
// "nodetrust bootstrap-token v1" || 0 || id || 0 || node || 0 ||
// expiration (the Secret's expiration field, RFC 3339). The label keeps
// the signature from passing for any other message of the same key.
func tokenDigest(id, node string, expiration []byte) []byte {
	h := sha256.New()
	for i, part := range [][]byte{[]byte("nodetrust bootstrap-token v1"), []byte(id), []byte(node), expiration} {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write(part)
	}
	return h.Sum(nil)
}

// signToken returns the SignatureAnnotation value for a token.
func signToken(signer crypto.Signer, id, node string, expiration []byte) (string, error) {
	sig, err := pki.SignP1363(signer, tokenDigest(id, node, expiration))
	if err != nil {
		return "", fmt.Errorf("sign the bootstrap token of node %s: %w", node, err)
	}
	return base64.StdEncoding.EncodeToString(sig), nil
}

// signedByFleetd reports whether s, a bootstrap token Secret, carries a
// valid signature by pub over its id, node label and expiration.
func signedByFleetd(pub *ecdsa.PublicKey, s *corev1.Secret) bool {
	sig, err := base64.StdEncoding.DecodeString(s.Annotations[SignatureAnnotation])
	if err != nil || len(sig) == 0 {
		return false
	}
	id := string(s.Data["token-id"])
	if s.Name != tokenSecretPrefix+id {
		return false
	}
	// The name is the id's and a label value is a DNS label: neither can
	// hold the 0 that separates the digest's parts.
	node, ok := s.Labels[NodeLabel]
	if !ok {
		return false
	}
	return pki.VerifyP1363(pub, tokenDigest(id, node, s.Data["expiration"]), sig)
}

// IssueBootstrapToken creates a bootstrap token of node's own in the
// cluster: a random id and secret, valid for authentication only, until
// now+ttl, in group [BootstrapGroup], its Secret labelled with the node's
// name and signed by signer (fleetd's JoinService signing key, an ECDSA
// key) in [SignatureAnnotation]. The node name must be a valid Kubernetes
// label value (a DNS label of at most 63 characters, as node names from
// hostnames are).
func IssueBootstrapToken(ctx context.Context, client kubernetes.Interface, signer crypto.Signer, node string, ttl time.Duration, now time.Time) (BootstrapToken, error) {
	if errs := validation.IsDNS1123Label(node); len(errs) > 0 {
		return BootstrapToken{}, fmt.Errorf("node name %q cannot label a bootstrap token: %s", node, errs[0])
	}
	if ttl <= 0 {
		return BootstrapToken{}, fmt.Errorf("bootstrap token lifetime %s: give a positive duration", ttl)
	}
	if signer == nil {
		return BootstrapToken{}, errors.New("issue a bootstrap token: no signing key (fleetd's JoinService signing key)")
	}
	for range 3 {
		id, err := randomString(tokenIDLen)
		if err != nil {
			return BootstrapToken{}, err
		}
		secret, err := randomString(tokenSecretLen)
		if err != nil {
			return BootstrapToken{}, err
		}
		t := BootstrapToken{ID: id, Node: node, Expires: now.Add(ttl).UTC().Truncate(time.Second), secret: secret}
		expiration := t.Expires.Format(time.RFC3339)
		sig, err := signToken(signer, id, node, []byte(expiration))
		if err != nil {
			return BootstrapToken{}, err
		}
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: tokenSecretPrefix + id, Namespace: TokenNamespace,
				Labels:      map[string]string{NodeLabel: node},
				Annotations: map[string]string{SignatureAnnotation: sig},
			},
			Type: corev1.SecretTypeBootstrapToken,
			StringData: map[string]string{
				"description":                    "nodetrust: the bootstrap token of node " + node + " alone",
				"token-id":                       id,
				"token-secret":                   secret,
				"expiration":                     expiration,
				"usage-bootstrap-authentication": "true",
				"auth-extra-groups":              BootstrapGroup,
			},
		}
		_, err = client.CoreV1().Secrets(TokenNamespace).Create(ctx, s, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue // an id drawn twice: draw again
		}
		if err != nil {
			return BootstrapToken{}, fmt.Errorf("create the bootstrap token of node %s: %w", node, err)
		}
		return t, nil
	}
	return BootstrapToken{}, errors.New("create a bootstrap token: three random ids were all taken")
}

// DeleteBootstrapTokens deletes every bootstrap token fleetd issued for
// node, and returns how many it deleted.
func DeleteBootstrapTokens(ctx context.Context, client kubernetes.Interface, node string) (int, error) {
	secrets := client.CoreV1().Secrets(TokenNamespace)
	list, err := secrets.List(ctx, metav1.ListOptions{
		LabelSelector: NodeLabel + "=" + node,
		FieldSelector: "type=" + string(corev1.SecretTypeBootstrapToken),
	})
	if err != nil {
		return 0, fmt.Errorf("list the bootstrap tokens of node %s: %w", node, err)
	}
	n := 0
	for _, s := range list.Items {
		err := secrets.Delete(ctx, s.Name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("delete bootstrap token %s of node %s: %w", s.Name, node, err)
		}
		n++
	}
	return n, nil
}

// randomString returns n characters drawn uniformly from tokenAlphabet.
func randomString(n int) (string, error) {
	b := make([]byte, n)
	for i := range b {
		// 252 is the largest multiple of 36 below 256: reject above it.
		for {
			var c [1]byte
			if _, err := rand.Read(c[:]); err != nil {
				return "", fmt.Errorf("random bootstrap token: %w", err)
			}
			if c[0] < 252 {
				b[i] = tokenAlphabet[int(c[0])%len(tokenAlphabet)]
				break
			}
		}
	}
	return string(b), nil
}

// TokenIssuer issues the bootstrap token of each node fleetd renders a
// config for (the Install RPC's service.BootstrapTokens).
type TokenIssuer struct {
	Client kubernetes.Interface
	// Signer signs each token: fleetd's JoinService signing key, whose
	// public half the Approver checks.
	Signer crypto.Signer
	// TTL is each token's lifetime ([kubernetes] token_lifetime).
	TTL time.Duration
}

// IssueBootstrapToken deletes node's earlier tokens (an install issued
// again leaves one token per node, not one per install), then issues
// node's token with IssueBootstrapToken and returns its id, its bearer
// form (for the render alone) and its expiry.
func (i TokenIssuer) IssueBootstrapToken(ctx context.Context, node string, now time.Time) (id, bearer string, expires time.Time, err error) {
	if errs := validation.IsDNS1123Label(node); len(errs) > 0 {
		return "", "", time.Time{}, fmt.Errorf("node name %q cannot label a bootstrap token: %s", node, errs[0])
	}
	if _, err := DeleteBootstrapTokens(ctx, i.Client, node); err != nil {
		return "", "", time.Time{}, err
	}
	t, err := IssueBootstrapToken(ctx, i.Client, i.Signer, node, i.TTL, now)
	if err != nil {
		return "", "", time.Time{}, err
	}
	return t.ID, t.Bearer(), t.Expires, nil
}
