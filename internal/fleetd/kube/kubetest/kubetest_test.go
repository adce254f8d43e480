package kubetest_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nodetrust/nodetrust/internal/fleetd/kube/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// TestCluster: the administrator is one, an unknown bearer token is not
// authenticated, Apply creates objects.
func TestCluster(t *testing.T) {
	c := kubetest.Start(t)
	ctx := t.Context()
	admin := c.Admin(t)
	if err := c.Apply(ctx, []byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: applied\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n  namespace: applied\ndata:\n  k: v\n")); err != nil {
		t.Fatal(err)
	}
	cm, err := admin.CoreV1().ConfigMaps("applied").Get(ctx, "cm", metav1.GetOptions{})
	if err != nil || cm.Data["k"] != "v" {
		t.Fatalf("the applied ConfigMap: %v, %v", cm, err)
	}
	stranger, err := kubernetes.NewForConfig(c.BearerConfig("abcdef.0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stranger.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("an unknown bootstrap token: %v, want unauthorized", err)
	}
}

// TestKwokMakesNodesReady: with kwok, a Node the test creates becomes
// Ready.
func TestKwokMakesNodesReady(t *testing.T) {
	c := kubetest.Start(t)
	c.StartKwok(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	nodes := c.Admin(t).CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kwok-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := nodes.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", "kwok-node").String()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		n, ok := ev.Object.(*corev1.Node)
		if !ok {
			continue
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return
			}
		}
	}
	t.Fatalf("the Node did not become Ready: %v", context.Cause(ctx))
}
