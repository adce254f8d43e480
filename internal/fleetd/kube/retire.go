package kube

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
)

// DefaultDrainTimeout bounds a drain when RetireOptions leaves it zero.
const DefaultDrainTimeout = 2 * time.Minute

// ErrDrainTimeout is a drain that did not finish within its timeout: pods
// whose eviction a PodDisruptionBudget kept refusing, or that did not go.
var ErrDrainTimeout = errors.New("the drain did not finish within its timeout")

// RetireOptions configure [Retire].
type RetireOptions struct {
	// DrainTimeout bounds the drain (DefaultDrainTimeout when zero).
	DrainTimeout time.Duration
	// RetryInterval is the wait between evictions a PodDisruptionBudget
	// refused, and between checks that evicted pods are gone (1 s when
	// zero).
	RetryInterval time.Duration
}

// RetireResult is what [Retire] did.
type RetireResult struct {
	// Evicted are the pods evicted ("namespace/name").
	Evicted []string
	// Blocked are the pods still not evicted at the drain timeout,
	// refused by a PodDisruptionBudget (or not gone): the Node was not
	// deleted.
	Blocked []string
	// NodeDeleted says the Node was deleted (false when there was none).
	NodeDeleted bool
	// CSRsDeleted and TokensDeleted count the node's kubelet certificate
	// requests and bootstrap tokens deleted.
	CSRsDeleted, TokensDeleted int
}

// Retire removes a retired node from the cluster: it cordons and drains
// its Node through the Eviction API (so PodDisruptionBudgets hold; a
// refused eviction is retried until the drain timeout), then deletes the
// Node, the node's kubelet certificate requests and its bootstrap tokens.
// DaemonSet pods and mirror pods are not evicted, as kubectl drain
// --ignore-daemonsets does: they go with the Node. A drain that times out
// returns ErrDrainTimeout and leaves the Node (cordoned), its requests and
// tokens are deleted all the same. Retire can be called again: what is
// gone already is skipped.
func Retire(ctx context.Context, client kubernetes.Interface, node string, o RetireOptions) (RetireResult, error) {
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = time.Second
	}
	var res RetireResult
	var errs []error
	// The tokens first: whatever happens to the drain, the node cannot
	// join again with one.
	if len(validation.IsValidLabelValue(node)) == 0 { // else no token can be the node's
		n, err := DeleteBootstrapTokens(ctx, client, node)
		res.TokensDeleted = n
		errs = append(errs, err)
	}
	drained, err := drain(ctx, client, node, o, &res)
	errs = append(errs, err)
	if drained {
		err := client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
		switch {
		case err == nil:
			res.NodeDeleted = true
		case !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("delete Node %s: %w", node, err))
		}
	}
	n, err := deleteNodeCSRs(ctx, client, node)
	res.CSRsDeleted = n
	errs = append(errs, err)
	return res, errors.Join(errs...)
}

// drain cordons node's Node and evicts its pods, waiting until they are
// gone. It reports whether the Node is drained (or absent).
func drain(ctx context.Context, client kubernetes.Interface, node string, o RetireOptions, res *RetireResult) (bool, error) {
	nodes := client.CoreV1().Nodes()
	n, err := nodes.Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("drain Node %s: %w", node, err)
	}
	if !n.Spec.Unschedulable {
		patch := []byte(`{"spec":{"unschedulable":true}}`)
		if _, err := nodes.Patch(ctx, node, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			return false, fmt.Errorf("cordon Node %s before its drain: %w", node, err)
		}
	}
	deadline := time.Now().Add(o.DrainTimeout)
	evicted := map[string]bool{}
	for {
		pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
		})
		if err != nil {
			return false, fmt.Errorf("list the pods of Node %s: %w", node, err)
		}
		var left []string
		for i := range pods.Items {
			p := &pods.Items[i]
			if !evictable(p) {
				continue
			}
			key := p.Namespace + "/" + p.Name
			left = append(left, key)
			if p.DeletionTimestamp != nil || evicted[key] {
				continue // going: wait for it
			}
			err := client.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
			switch {
			case err == nil:
				evicted[key] = true
				res.Evicted = append(res.Evicted, key)
			case apierrors.IsNotFound(err):
			case apierrors.IsTooManyRequests(err):
				// A PodDisruptionBudget refuses it now: retried below.
			default:
				return false, fmt.Errorf("evict pod %s from Node %s: %w", key, node, err)
			}
		}
		if len(left) == 0 {
			return true, nil
		}
		if !time.Now().Before(deadline) {
			res.Blocked = left
			return false, fmt.Errorf("drain Node %s: %w (%s): pods %v still there, refused by a PodDisruptionBudget or not gone; the Node is cordoned and not deleted: evict them by hand (kubectl drain %s), then delete the Node",
				node, ErrDrainTimeout, o.DrainTimeout, left, node)
		}
		sleep(ctx, o.RetryInterval)
		if ctx.Err() != nil {
			return false, fmt.Errorf("drain Node %s: %w", node, ctx.Err())
		}
	}
}

// evictable reports whether a drain evicts p: not a mirror pod (the
// kubelet's static pods), not a DaemonSet's (it would come back), not
// finished already.
func evictable(p *corev1.Pod) bool {
	if _, ok := p.Annotations[corev1.MirrorPodAnnotationKey]; ok {
		return false
	}
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return false
		}
	}
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// deleteNodeCSRs deletes the certificate requests of node's kubelet: made
// as system:node:<node> (renewals, serving certificates), or asking for a
// subject system:node:<node> (the first one, made with a bootstrap token).
func deleteNodeCSRs(ctx context.Context, client kubernetes.Interface, node string) (int, error) {
	csrs := client.CertificatesV1().CertificateSigningRequests()
	list, err := csrs.List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list the certificate requests of node %s: %w", node, err)
	}
	n := 0
	for i := range list.Items {
		c := &list.Items[i]
		if c.Spec.Username != nodeUserPrefix+node && requestedSubject(c) != nodeUserPrefix+node {
			continue
		}
		err := csrs.Delete(ctx, c.Name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("delete certificate request %s of node %s: %w", c.Name, node, err)
		}
		n++
	}
	return n, nil
}

// requestedSubject is the common name a request asks for, or "".
func requestedSubject(c *certificatesv1.CertificateSigningRequest) string {
	block, _ := pem.Decode(c.Spec.Request)
	if block == nil {
		return ""
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return ""
	}
	return req.Subject.CommonName
}
