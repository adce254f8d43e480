//go:build tpmsim

package service_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube/kubetest"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// TestSimBootCheckCordonsTheWorkersNode: with the Kubernetes actuator
// ([actuator] kind = "kubernetes"), a worker quarantined by a failed boot
// check has its Node cordoned in a real API server, and fleetd nodes
// release uncordons it.
func TestSimBootCheckCordonsTheWorkersNode(t *testing.T) {
	c := kubetest.Start(t)
	admin := c.Admin(t)
	cordoner := kube.NewCordoner(admin, []string{"control-plane"})
	b := newBootEnv(t, func(cfg *service.Config) {
		cfg.Actuator, cfg.ReleaseHooks = cordoner, []lifecycle.ReleaseHook{cordoner}
	})
	nodes := admin.CoreV1().Nodes()
	if _, err := nodes.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: b.n.id}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cordoned := func() bool {
		t.Helper()
		n, err := nodes.Get(t.Context(), b.n.id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Spec.Unschedulable
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := b.session(t, ctx)
	resp, err := b.check(t, st, func(n []byte) *gatewayv1.SessionRequest { return evidenceMsg(b.evidence(t, n, falseLog())) })
	if err != nil || resp.Action != "quarantined" {
		t.Fatalf("CheckNode = %v, %v; want quarantined", resp, err)
	}
	if got := b.storedNode(t, b.n.id).State; got != store.StateQuarantined {
		t.Fatalf("state %s, want quarantined", got)
	}
	if !cordoned() {
		t.Fatal("the quarantined worker's Node is schedulable")
	}
	if got := b.metric(t, `nodetrust_actuator_requests_total{actuator="kubernetes",outcome="ok"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("cordons counted %q, want 1", got)
	}
	rel, err := b.admin.TransitionNode(t.Context(), &adminv1.TransitionNodeRequest{Id: b.n.id, Action: "release", Reason: "checked"})
	if err != nil || len(rel.Warnings) != 0 {
		t.Fatalf("release: %v, %v", rel, err)
	}
	if cordoned() {
		t.Error("the released worker's Node is still cordoned")
	}
}
