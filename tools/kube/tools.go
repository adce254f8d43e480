//go:build tools

// Package kubetools names the commands scripts/kube-deps.sh builds, so that
// go mod tidy keeps their dependencies.
package kubetools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
