// Package agent is the node's side of identity: joining the control plane
// and, later, keeping the identity fresh. It takes a *slog.Logger and logs
// what a node operator needs to see; the files it writes are described in
// package identity.
package agent
