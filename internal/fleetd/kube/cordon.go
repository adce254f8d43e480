package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nodetrust/nodetrust/internal/fleetd/actuator"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const (
	// CordonedAnnotation marks a Node fleetd cordoned, with the id of the
	// quarantine that asked: release uncordons only such a Node, never one
	// an operator cordoned.
	CordonedAnnotation = "nodetrust.io/cordoned"
	// controlPlaneLabel marks a control-plane Node (kubeadm, Talos).
	controlPlaneLabel = "node-role.kubernetes.io/control-plane"
)

// ErrControlPlane is returned for a cordon of a control-plane machine: a
// failed control-plane machine raises an alert and is never cordoned
// automatically (seed 003).
var ErrControlPlane = errors.New("a control-plane machine is never cordoned automatically: review it and act by hand")

// Cordoner is the Kubernetes quarantine actuator: it marks a quarantined
// worker's Node unschedulable, as kubectl cordon does, and release
// uncordons it. The Node's name is the fleetd node's id.
type Cordoner struct {
	client       kubernetes.Interface
	controlPlane []string
}

var _ actuator.Actuator = (*Cordoner)(nil)

// NewCordoner returns the actuator; controlPlaneClasses are the classes
// never cordoned ([boot_policy] control_plane_classes). A Node labelled
// node-role.kubernetes.io/control-plane is not cordoned whatever its class.
func NewCordoner(client kubernetes.Interface, controlPlaneClasses []string) *Cordoner {
	return &Cordoner{client: client, controlPlane: slices.Clone(controlPlaneClasses)}
}

// Name names the actuator in logs and metrics.
func (k *Cordoner) Name() string { return "kubernetes" }

// Cordon marks the node's Node unschedulable and annotates it with the
// quarantine's request id. A Node cordoned already is left as it is (and
// not annotated: its cordon is someone else's). A control-plane class or
// Node gets ErrControlPlane and no change.
func (k *Cordoner) Cordon(ctx context.Context, c actuator.Cordon) error {
	if slices.Contains(k.controlPlane, c.Class) {
		return fmt.Errorf("node %s (class %s): %w", c.NodeID, c.Class, ErrControlPlane)
	}
	node, err := k.client.CoreV1().Nodes().Get(ctx, c.NodeID, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("cordon node %s: %w", c.NodeID, err)
	}
	if _, ok := node.Labels[controlPlaneLabel]; ok {
		return fmt.Errorf("node %s (labelled %s): %w", c.NodeID, controlPlaneLabel, ErrControlPlane)
	}
	if node.Spec.Unschedulable {
		return nil
	}
	mark := c.RequestID
	if mark == "" {
		mark = "quarantine"
	}
	return k.patch(ctx, c.NodeID, node.ResourceVersion, true, &mark)
}

// Uncordon makes the node's Node schedulable again if fleetd cordoned it
// (its annotation), at release. It reports whether it uncordoned; a Node
// that is gone, or cordoned by someone else, is left alone.
func (k *Cordoner) Uncordon(ctx context.Context, nodeID string) (bool, error) {
	node, err := k.client.CoreV1().Nodes().Get(ctx, nodeID, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("uncordon node %s: %w", nodeID, err)
	}
	if _, ok := node.Annotations[CordonedAnnotation]; !ok {
		return false, nil
	}
	if err := k.patch(ctx, nodeID, node.ResourceVersion, false, nil); err != nil {
		return false, err
	}
	return true, nil
}

// Released uncordons n's Node at the release of its quarantine (a
// lifecycle.ReleaseHook): an error is the release's warning, and the
// operator uncordons by hand.
func (k *Cordoner) Released(ctx context.Context, n store.Node, _ string) error {
	if _, err := k.Uncordon(ctx, n.ID); err != nil {
		return fmt.Errorf("%w: uncordon it by hand (kubectl uncordon %s)", err, n.ID)
	}
	return nil
}

// patch sets the Node's unschedulable flag and sets (or, nil, removes)
// fleetd's annotation, conditional on the version read: a Node changed
// meanwhile is a conflict, and the caller tries again later.
func (k *Cordoner) patch(ctx context.Context, name, version string, unschedulable bool, mark *string) error {
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"resourceVersion": version,
			"annotations":     map[string]*string{CordonedAnnotation: mark},
		},
		"spec": map[string]any{"unschedulable": unschedulable},
	})
	if err != nil {
		return err
	}
	verb := "cordon"
	if !unschedulable {
		verb = "uncordon"
	}
	if _, err := k.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("%s node %s: %w", verb, name, err)
	}
	return nil
}
