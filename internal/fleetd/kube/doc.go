// Package kube is fleetd's side of a Kubernetes cluster's node admission
// (seed 003, "Join under another node's name with a bootstrap token"): each
// worker's rendered config carries a bootstrap token of its own
// ([IssueBootstrapToken]), which expires hours after the render and is
// labelled with the node's name, and an [Approver] approves a kubelet's
// client certificate request only when it was made with the token of
// exactly the node it names, once, then deletes the token. Every other
// request made with a bootstrap token is denied; requests not made with one
// (a kubelet renewing its certificate) are left to the cluster.
//
// The manifests in deploy/kubernetes take the automatic approval of
// bootstrap requests away from the controller manager, so that this check
// is the only way in (docs/kubernetes.md). The package does not log: its
// callers log and count the decisions it returns. It never puts a token's
// secret in an error.
package kube
