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
# inputs prints how many inputs a target's testdata/fuzz folder holds.
inputs() { if [ -d "$1" ]; then find "$1" -type f | wc -l; else echo 0; fi; }
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
    for try in 1 2 3; do
      echo "fuzz: ./$dir $target ($FUZZTIME)" >&2
      crashers=$(inputs "$root/$dir/testdata/fuzz/$target")
      if (cd "$root/$dir" && "$bin" -test.run='^$' -test.fuzz="^${target}\$" -test.fuzztime="$FUZZTIME" \
        -test.fuzzcachedir="$cache" >"$tmp/run.log" 2>&1); then
        break
      fi
      cat "$tmp/run.log" >&2
      # Go 1.26's fuzzing coordinator can report its own -fuzztime deadline
      # as a failure ("context deadline exceeded", no input written) when a
      # worker is slow to stop on a loaded machine (go.dev/issue/75804,
      # fixed in Go 1.27). That is not a finding: run the target again.
      # Anything else, or a new crasher file, is a failure.
      if [ "$try" -lt 3 ] && grep -qx '    context deadline exceeded' "$tmp/run.log" &&
        ! grep -q 'Failing input written' "$tmp/run.log" &&
        [ "$(inputs "$root/$dir/testdata/fuzz/$target")" = "$crashers" ]; then
        echo "fuzz: $target stopped on the fuzzing coordinator's deadline race (go.dev/issue/75804), not a finding; running it again" >&2
        continue
      fi
      failed+=("./$dir $target")
      break
    done
  done
done
echo "fuzz: $count targets in $(($(date +%s) - start))s" >&2
if [ ${#failed[@]} -gt 0 ]; then
  printf 'fuzz: FAILED %s (a crasher is in its testdata/fuzz folder)\n' "${failed[@]}" >&2
  exit 1
fi
