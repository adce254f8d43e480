#!/usr/bin/env bash
# Builds spire-server and spire-agent (SPIRE_VERSION, default v1.13.3) from
# the Go module proxy as Go tools of a scratch module, into
# .deps/spire/<version>/bin (ignored by git). A later run finds them there and
# does nothing. Prints the bin folder. The cold build takes about 9 minutes on
# 2 cores (cgo, for SPIRE's SQLite datastore).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${SPIRE_VERSION:-v1.13.3}"
root="$PWD/.deps/spire/$version"
bin="$root/bin"
if [ -x "$bin/spire-server" ] && [ -x "$bin/spire-agent" ]; then
  echo "$bin"
  exit 0
fi
if ! command -v gcc >/dev/null 2>&1; then
  echo "spire-deps: gcc is missing: SPIRE's SQLite datastore needs cgo (install Debian's gcc)" >&2
  exit 1
fi
mod="$root/mod"
rm -rf "$mod" "$bin.tmp"
mkdir -p "$mod" "$bin.tmp"
(
  cd "$mod"
  cat >go.mod <<MOD
module nodetrust.local/spiretools

go 1.24
MOD
  echo "spire-deps: building spire-server and spire-agent $version (about 9 minutes cold)" >&2
  GOFLAGS=-mod=mod go get -tool "github.com/spiffe/spire/cmd/spire-server@$version" \
    "github.com/spiffe/spire/cmd/spire-agent@$version" >&2
  CGO_ENABLED=1 GOBIN="$bin.tmp" go install tool >&2
)
rm -rf "$bin"
mv "$bin.tmp" "$bin"
echo "$bin"
