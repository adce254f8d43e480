package kube_test

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodetrust/nodetrust/internal/fleetd/actuator"
	"github.com/nodetrust/nodetrust/internal/fleetd/kube"
)

// TestCordon: a quarantined worker is cordoned; a control-plane machine
// (by class, or by its Node's role label) is not; release uncordons what
// fleetd cordoned and only that.
func TestCordon(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	nodes := e.admin.CoreV1().Nodes()
	runID := newRunID()
	worker, cp, cp2, ops := "cordon-worker-"+runID, "cordon-cp-"+runID, "cordon-cp2-"+runID, "cordon-ops-"+runID
	for name, labels := range map[string]map[string]string{
		worker: nil,
		cp:     {"node-role.kubernetes.io/control-plane": ""},
		cp2:    nil,
		ops:    nil,
	} {
		if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	unschedulable := func(name string) bool {
		t.Helper()
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Spec.Unschedulable
	}
	k := kube.NewCordoner(e.fleetd, []string{"control-plane"})

	if err := k.Cordon(ctx, actuator.Cordon{Action: "cordon", NodeID: worker, Class: "worker", RequestID: "q1"}); err != nil {
		t.Fatal(err)
	}
	if !unschedulable(worker) {
		t.Fatal("the quarantined worker is schedulable")
	}
	if err := k.Cordon(ctx, actuator.Cordon{NodeID: cp, Class: "worker"}); !errors.Is(err, kube.ErrControlPlane) {
		t.Fatalf("cordon of a Node labelled control-plane: %v, want ErrControlPlane", err)
	}
	if err := k.Cordon(ctx, actuator.Cordon{NodeID: cp2, Class: "control-plane"}); !errors.Is(err, kube.ErrControlPlane) {
		t.Fatalf("cordon of a control-plane class: %v, want ErrControlPlane", err)
	}
	if unschedulable(cp) || unschedulable(cp2) {
		t.Fatal("a control-plane machine was cordoned")
	}

	// An operator's cordon: a quarantine leaves it, release does not lift it.
	if _, err := nodes.Patch(ctx, ops, "application/merge-patch+json", []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k.Cordon(ctx, actuator.Cordon{NodeID: ops, Class: "worker"}); err != nil {
		t.Fatal(err)
	}
	if did, err := k.Uncordon(ctx, ops); err != nil || did || !unschedulable(ops) {
		t.Fatalf("release of a Node an operator cordoned: uncordoned %v, %v; want left cordoned", did, err)
	}

	if did, err := k.Uncordon(ctx, worker); err != nil || !did {
		t.Fatalf("release: uncordoned %v, %v; want uncordoned", did, err)
	}
	if unschedulable(worker) {
		t.Fatal("the released worker is still cordoned")
	}
	if did, err := k.Uncordon(ctx, "no-such-node"); err != nil || did {
		t.Fatalf("release of a node with no Node: %v, %v; want nothing done", did, err)
	}
	if err := k.Cordon(ctx, actuator.Cordon{NodeID: "no-such-node", Class: "worker"}); err == nil {
		t.Fatal("cordon of a node with no Node succeeded")
	}
}
