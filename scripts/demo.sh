#!/usr/bin/env bash
# make demo: start a development control plane, join one node into a
# temporary data directory, show the node's identity and the server's node
# list, and stop cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
work=$(mktemp -d -t nodetrust-demo-XXXXXX)
fleetd_pid=
cleanup() {
  if [ -n "$fleetd_pid" ] && kill -0 "$fleetd_pid" 2>/dev/null; then
    kill -INT "$fleetd_pid" 2>/dev/null || true
    wait "$fleetd_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "==> fleetd dev (state in $work/fleet)"
mkfifo "$work/out"
"$BIN/fleetd" dev --dir "$work/fleet" --log-level warn >"$work/out" 2>"$work/fleetd.log" &
fleetd_pid=$!
# Echo fleetd dev's instructions until its last line, which says it is ready.
while IFS= read -r line; do
  echo "    $line"
  case "$line" in "Stop with Ctrl-C"*) break ;; esac
done <"$work/out"
cat "$work/out" >/dev/null &

# shellcheck disable=SC1091
. "$work/fleet/dev.env"
# The demo machine describes itself from a small folder tree instead of the
# host's /sys, so it gets a readable node id and no real serials leak.
mkdir -p "$work/claims/etc"
echo "demo-node-1" >"$work/claims/etc/hostname"
echo "==> bcd join"
NODETRUST_DEBUG_CLAIMS_ROOT="$work/claims" "$BIN/bcd" join --server "$FLEETD_SERVER" \
  --serving-ca-spki-pin "$SERVING_CA_SPKI_PIN" \
  --join-signing-key-pin "$JOIN_SIGNING_KEY_PIN" \
  --join-encryption-key-pin "$JOIN_ENCRYPTION_KEY_PIN" \
  --data-dir "$BCD_DATA_DIR" --token-file "$BCD_TOKEN_FILE"
echo "==> bcd join again (reads no token)"
"$BIN/bcd" join --server "$FLEETD_SERVER" \
  --serving-ca-spki-pin "$SERVING_CA_SPKI_PIN" \
  --join-signing-key-pin "$JOIN_SIGNING_KEY_PIN" \
  --join-encryption-key-pin "$JOIN_ENCRYPTION_KEY_PIN" \
  --data-dir "$BCD_DATA_DIR" </dev/null
echo "==> bcd status"
"$BIN/bcd" status --data-dir "$BCD_DATA_DIR"
echo "==> fleetd nodes list"
"$BIN/fleetd" nodes list --config "$FLEETD_CONFIG"
echo "==> stopping fleetd"
kill -INT "$fleetd_pid"
wait "$fleetd_pid"
fleetd_pid=
echo "demo finished"
