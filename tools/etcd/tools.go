//go:build tools

// Package etcdtools names the command scripts/kube-deps.sh builds, so that go
// mod tidy keeps its dependencies.
package etcdtools

import _ "go.etcd.io/etcd/server/v3"
