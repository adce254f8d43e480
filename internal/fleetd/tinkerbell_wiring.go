package fleetd

import (
	"fmt"
	"os"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/tinkerbell"
)

// tinkerbellProvisioner is the writer of [tinkerbell]'s objects, with the
// cluster of its kubeconfig. It powers no machine: the Install RPC calls
// only Apply.
func tinkerbellProvisioner(cfg *config.Fleetd) (*tinkerbell.Provisioner, error) {
	tb := cfg.Tinkerbell
	path := cfg.Resolve(tb.Kubeconfig)
	if err := checkKubeconfig("tinkerbell.kubeconfig", path); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tinkerbell.kubeconfig: %w", err)
	}
	// The parser's error may quote the file, credential and all: it is
	// not shown.
	kc, err := clientcmd.Load(data)
	if err != nil {
		return nil, fmt.Errorf("tinkerbell.kubeconfig: %s is not a kubeconfig file (check it with kubectl --kubeconfig %s get hardware -n %s)", path, path, tb.Namespace)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("tinkerbell.kubeconfig: %s: %w", path, err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("tinkerbell.kubeconfig: %s: %w", path, err)
	}
	return tinkerbell.New(dyn, tinkerbell.Settings{Namespace: tb.Namespace, ActionImage: tb.ActionImage, FleetdURL: tb.FleetdURL,
		Installer: tb.Installer, ActionTimeout: tb.ActionTimeout.Duration, CodeWait: tb.CodeWait.Duration}, nil)
}
