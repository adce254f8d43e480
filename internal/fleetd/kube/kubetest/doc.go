// Package kubetest starts a throwaway Kubernetes control plane for tests:
// etcd, kube-apiserver and kube-controller-manager (its csrsigning
// controller, which signs approved kubelet certificates) on free loopback
// ports, their certificates and data in a temporary folder; on demand,
// kwok, which plays the kubelet of every Node. It returns an admin's client
// configuration, and one for any bearer token (a bootstrap token, a
// service account's), and applies manifests.
//
// The binaries are those scripts/kube-deps.sh builds into
// .deps/kube/<versions>/bin (make deps does). Under CI (CI=true) a missing
// binary fails the test and names the script; elsewhere the test is skipped
// with a one-line reason. Imported by tests only.
package kubetest
