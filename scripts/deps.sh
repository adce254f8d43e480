#!/usr/bin/env bash
# Installs what nodetrust's build, demo and tests need: Go modules, and, when
# run as root, the Debian packages below. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: protoc for the generated-code check; SoftHSM2 for the
# PKCS#11 tests (fleetd's keys in a token); chromium for the console's
# browser tests; openssl, which checks issued certificates in pki's tests;
# gcc for cgo (the TPM simulator, and SPIRE's build); lldpd, whose lldpctl
# the network report's tests run.
packages=(protobuf-compiler softhsm2 chromium openssl gcc lldpd)
commands=(protoc softhsm2-util chromium openssl gcc lldpctl)

missing=()
for i in "${!packages[@]}"; do
  command -v "${commands[$i]}" >/dev/null 2>&1 || missing+=("${packages[$i]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "deps: missing Debian packages: ${missing[*]} (run 'make deps' as root, or install them)" >&2
  fi
fi

# PostgreSQL for the PostgreSQL store's tests and the replicas' end-to-end
# test: they start throwaway clusters of their own on loopback (as the
# postgres user when run as root), never the system's cluster.
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps: installing postgresql" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  else
    echo "deps: missing Debian package: postgresql (run 'make deps' as root, or install it)" >&2
  fi
fi

# swtpm, swtpm-tools and tpm2-tools for the TPM integration tests.
./scripts/swtpm-deps.sh || true

go mod download
# NetBox's OpenAPI schema, which the fake NetBox's tests check it against
# (read from the module cache; no Go code imports the module).
go mod download github.com/netbox-community/go-netbox/v4@v4.3.0
# Tinkerbell's CRDs (Hardware, Template, Workflow), which the Tinkerbell
# objects' tests install in their API server (read from the module cache;
# no Go code imports the module).
go mod download github.com/tinkerbell/tink@v0.10.1

# spire-server and spire-agent for the SPIRE export's integration tests,
# built once from the Go module proxy into .deps/spire/<version>/bin
# (about 9 minutes cold; later runs reuse them).
./scripts/spire-deps.sh >/dev/null

# etcd, kube-apiserver, kube-controller-manager and kwok for the Kubernetes
# tests (internal/fleetd/kube), built once from the Go module proxy into
# .deps/kube/<versions>/bin (about 10 CPU-minutes cold; later runs reuse them).
./scripts/kube-deps.sh >/dev/null
