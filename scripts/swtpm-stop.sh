#!/usr/bin/env bash
# Stops the swtpm that scripts/swtpm-start.sh DIR started (by DIR/swtpm.pid).
# The TPM state stays in DIR for the next start.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
pidfile=$1/swtpm.pid
if [ ! -s "$pidfile" ]; then
  exit 0
fi
pid=$(cat "$pidfile")
if kill "$pid" 2>/dev/null; then
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null || true
  fi
fi
rm -f "$pidfile"
