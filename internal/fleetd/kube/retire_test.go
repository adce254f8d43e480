package kube_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodetrust/nodetrust/internal/fleetd/kube"
)

// retireNode creates a Node (kwok plays its kubelet) with pods bound to
// it, labelled app=<app>, and waits until they run.
func retireNode(t *testing.T, e env, name, app string, pods int) []string {
	t.Helper()
	ctx := t.Context()
	if _, err := e.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := range pods {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-", Namespace: "default", Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{NodeName: name, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app:" + string(rune('a'+i))}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
		}
		got, err := e.admin.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		waitPod(t, e, got.Name, func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodRunning })
		keys = append(keys, "default/"+got.Name)
	}
	return keys
}

// waitPod watches pod default/name until ok holds (p nil: the pod is gone).
func waitPod(t *testing.T, e env, name string, ok func(p *corev1.Pod) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	pods := e.admin.CoreV1().Pods("default")
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 && ok(nil) || len(list.Items) == 1 && ok(&list.Items[0]) {
		return
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		p, _ := ev.Object.(*corev1.Pod)
		if p == nil {
			continue
		}
		if ev.Type == "DELETED" {
			p = nil
		}
		if ok(p) {
			return
		}
	}
	t.Fatalf("pod %s: the wait ended: %v", name, context.Cause(ctx))
}

func csrExists(t *testing.T, e env, name string) bool {
	t.Helper()
	_, err := e.admin.CertificatesV1().CertificateSigningRequests().Get(t.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// TestRetireDrainsAndDeletes: retirement evicts the node's pods (kwok
// removes them), deletes its Node, its kubelet's certificate requests and
// its bootstrap tokens, and nothing of another node; a second run finds
// nothing left to do.
func TestRetireDrainsAndDeletes(t *testing.T) {
	e := setup(t)
	e.c.StartKwok(t)
	ctx := t.Context()
	runID := newRunID()
	node, other := "retire-"+runID, "retire-other-"+runID
	pods := retireNode(t, e, node, "retire-"+runID, 2)

	tok, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, node, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	otherTok, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, other, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// The first request of each kubelet, made with its bootstrap token.
	csr, _ := mustCSR(t, e, tok.Bearer(), node)
	otherCSR, _ := mustCSR(t, e, otherTok.Bearer(), other)
	// A spare token of the node, never used.
	spare, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, node, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	res, err := kube.Retire(ctx, e.fleetd, node, kube.RetireOptions{DrainTimeout: waitTimeout})
	if err != nil {
		t.Fatalf("retire: %v", err)
	}
	slices.Sort(res.Evicted)
	slices.Sort(pods)
	if !slices.Equal(res.Evicted, pods) || !res.NodeDeleted || res.CSRsDeleted != 1 || res.TokensDeleted != 2 || len(res.Blocked) > 0 {
		t.Fatalf("retire did %+v; want pods %v evicted, the Node, 1 request and 2 tokens deleted", res, pods)
	}
	for _, p := range pods {
		name := p[len("default/"):]
		if _, err := e.admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("pod %s after the drain: %v, want it gone", p, err)
		}
	}
	if _, err := e.admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Node after retirement: %v, want it gone", err)
	}
	if csrExists(t, e, csr.Name) || tokenExists(t, e, tok.ID) || tokenExists(t, e, spare.ID) {
		t.Error("the node's certificate request or a token of it is still there")
	}
	if !csrExists(t, e, otherCSR.Name) || !tokenExists(t, e, otherTok.ID) {
		t.Error("another node's certificate request or token was deleted")
	}

	again, err := kube.Retire(ctx, e.fleetd, node, kube.RetireOptions{DrainTimeout: waitTimeout})
	if err != nil || len(again.Evicted)+again.CSRsDeleted+again.TokensDeleted > 0 || again.NodeDeleted {
		t.Fatalf("a second retirement: %+v, %v; want nothing done", again, err)
	}
}

// TestRetireRespectsDisruptionBudgets: a pod a PodDisruptionBudget
// protects is not evicted; the drain gives up at its timeout, reporting
// the pod, and leaves the Node cordoned, but the node's token is deleted.
func TestRetireRespectsDisruptionBudgets(t *testing.T) {
	e := setup(t)
	e.c.StartKwok(t)
	ctx := t.Context()
	runID := newRunID()
	node, app := "retire-pdb-"+runID, "retire-pdb-"+runID
	pods := retireNode(t, e, node, app, 1)
	one := intstr.FromInt32(1)
	if _, err := e.admin.PolicyV1().PodDisruptionBudgets("default").Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: app},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := kube.IssueBootstrapToken(ctx, e.fleetd, joinKey, node, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	res, err := kube.Retire(ctx, e.fleetd, node, kube.RetireOptions{DrainTimeout: 2 * time.Second, RetryInterval: 200 * time.Millisecond})
	if !errors.Is(err, kube.ErrDrainTimeout) {
		t.Fatalf("retire with a pod its budget protects: %v, want ErrDrainTimeout", err)
	}
	if !slices.Equal(res.Blocked, pods) || len(res.Evicted) > 0 || res.NodeDeleted {
		t.Fatalf("retire did %+v; want %v blocked, nothing evicted, the Node kept", res, pods)
	}
	waitPod(t, e, pods[0][len("default/"):], func(p *corev1.Pod) bool { return p != nil && p.DeletionTimestamp == nil })
	n, err := e.admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || !n.Spec.Unschedulable {
		t.Fatalf("the Node after a drain that timed out: %v; want it there and cordoned", err)
	}
	if tokenExists(t, e, tok.ID) {
		t.Error("the node's token outlived its retirement")
	}
}
