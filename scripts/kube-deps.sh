#!/usr/bin/env bash
# Builds the Kubernetes control plane that internal/fleetd/kube's tests run
# against, into .deps/kube/<version>/bin (ignored by git): kube-apiserver and
# kube-controller-manager from k8s.io/kubernetes (the tools module
# tools/kube), etcd from go.etcd.io/etcd/server/v3 (tools/etcd), and kwok,
# which plays the kubelets, with its stage files in .deps/kube/<version>/stage.
# The versions are the tools modules' and kwok's below; the folder is named
# after all three. A later run finds the binaries there and does nothing.
# Prints the bin folder. The cold build takes about 10 CPU-minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
kube=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' tools/kube/go.mod)
etcd=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" { print $3 }' tools/etcd/go.mod)
kwok=v0.8.0
if [ -z "$kube" ] || [ -z "$etcd" ]; then
  echo "kube-deps: cannot read the versions from tools/kube/go.mod and tools/etcd/go.mod" >&2
  exit 1
fi
root="$PWD/.deps/kube/$kube-etcd$etcd-kwok$kwok"
bin="$root/bin"
stage="$root/stage"
if [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kube-controller-manager" ] &&
  [ -x "$bin/etcd" ] && [ -x "$bin/kwok" ] && [ -d "$stage" ]; then
  echo "$bin"
  exit 0
fi
rm -rf "$bin.tmp" "$stage.tmp"
mkdir -p "$bin.tmp" "$stage.tmp"
echo "kube-deps: building kube-apiserver and kube-controller-manager $kube, etcd $etcd and kwok $kwok (about 10 CPU-minutes cold)" >&2
# The version the binaries report (k8s.io/kubernetes sets it from git when it
# builds itself; without it they say v0.0.0-master).
minor=${kube#v1.}
minor=${minor%%.*}
version_flags="-X k8s.io/component-base/version.gitVersion=$kube -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
(cd tools/kube && CGO_ENABLED=0 go build -mod=readonly -ldflags="-s -w $version_flags" -o "$bin.tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
(cd tools/etcd && CGO_ENABLED=0 go build -mod=readonly -ldflags='-s -w' -o "$bin.tmp/etcd" \
  go.etcd.io/etcd/server/v3)
CGO_ENABLED=0 GOBIN="$bin.tmp" go install -ldflags='-s -w' "sigs.k8s.io/kwok/cmd/kwok@$kwok"
# kwok's "fast" stages: Nodes become Ready and pods Running at once, and pods
# being deleted go away, so that an eviction or a drain completes.
src=$(go mod download -json "sigs.k8s.io/kwok@$kwok" | awk -F'"' '$2 == "Dir" { print $4 }')
for kind in node pod; do
  for f in "$src/kustomize/stage/$kind/fast/"*.yaml; do
    [ "$(basename "$f")" = kustomization.yaml ] || cp "$f" "$stage.tmp/"
  done
done
chmod -R u+w "$stage.tmp"
rm -rf "$bin" "$stage"
mv "$stage.tmp" "$stage"
mv "$bin.tmp" "$bin"
echo "$bin"
