#!/usr/bin/env bash
# Runs every fuzz target of the module for FUZZTIME each (default 30s; CI
# runs a few seconds each). Each package's fuzzing test binary is built
# once. A crasher the fuzzer finds is written to the target's
# testdata/fuzz folder: commit it with the fix, and it stays a regression
# test that every `go test` runs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
FUZZTIME=${FUZZTIME:-30s}
cache=$(go env GOCACHE)/fuzz
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=()
count=0
start=$(date +%s)
# The packages with fuzz targets, and their targets.
for dir in $(git ls-files '*_test.go' | xargs grep -l '^func Fuzz' | xargs -n1 dirname | sort -u); do
  targets=$(cat "$dir"/*_test.go | sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(f \*testing\.F).*/\1/p' | sort -u)
  bin=$tmp/$(echo "$dir" | tr / _).test
  if ! go test -c -fuzz=. -o "$bin" "./$dir" >"$tmp/build.log" 2>&1; then
    cat "$tmp/build.log" >&2
    failed+=("./$dir (build)")
    continue
  fi
  for target in $targets; do
    count=$((count + 1))
    echo "fuzz: ./$dir $target ($FUZZTIME)" >&2
    if ! (cd "$root/$dir" && "$bin" -test.run='^$' -test.fuzz="^${target}\$" -test.fuzztime="$FUZZTIME" \
      -test.fuzzcachedir="$cache" >"$tmp/run.log" 2>&1); then
      cat "$tmp/run.log" >&2
      failed+=("./$dir $target")
    fi
  done
done
echo "fuzz: $count targets in $(($(date +%s) - start))s" >&2
if [ ${#failed[@]} -gt 0 ]; then
  printf 'fuzz: FAILED %s (a crasher is in its testdata/fuzz folder)\n' "${failed[@]}" >&2
  exit 1
fi
