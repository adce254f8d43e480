#!/usr/bin/env bash
# Starts a software TPM (swtpm) for tests and development:
#
#   scripts/swtpm-start.sh DIR PORT [RSA_KEYSIZE]
#
# DIR holds everything: the TPM state, a private local CA (DIR/localca) that
# signs the EK certificates, swtpm's log and its pid file (DIR/swtpm.pid).
# The first start of an empty DIR provisions the TPM with swtpm_setup: an RSA
# 2048 EK certificate at NV 0x01C00002 and an ECC P-384 one at 0x01C00016
# (swtpm_setup writes no P-256 one at 0x01C0000A); with RSA_KEYSIZE 3072 the
# RSA EK is RSA 3072 (template H-6) and its certificate sits at 0x01C0001C
# instead of 0x01C00002. A later start reuses the
# state, so a TPM keeps its seeds, and so its keys, across restarts.
#
# The TPM command port is PORT and its control port PORT+1, both on 127.0.0.1
# only. Connect with tpm = "tcp://127.0.0.1:PORT" (go-tpm's tpm2/transport/tcp,
# without PowerOn) or TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=PORT. swtpm
# serves one connection at a time and has no resource manager.
#
# Stop it with scripts/swtpm-stop.sh DIR. Needs the Debian packages swtpm,
# swtpm-tools (and tpm2-tools for a look from outside): scripts/swtpm-deps.sh.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 DIR PORT [RSA_KEYSIZE]" >&2
  exit 2
fi
dir=$1
port=$2
rsa_keysize=${3:-2048}
case $rsa_keysize in
  2048 | 3072) ;;
  *) echo "swtpm-start: RSA_KEYSIZE must be 2048 or 3072, not '$rsa_keysize'" >&2; exit 2 ;;
esac
case $port in
  '' | *[!0-9]*) echo "swtpm-start: PORT must be a number, not '$port'" >&2; exit 2 ;;
esac
if [ "$port" -lt 1 ] || [ "$port" -gt 65534 ]; then
  echo "swtpm-start: PORT must be 1..65534 (PORT+1 is the control port)" >&2
  exit 2
fi
ctrl=$((port + 1))

for cmd in swtpm swtpm_setup swtpm_localca; do
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "swtpm-start: $cmd is missing: install the Debian packages swtpm swtpm-tools tpm2-tools (scripts/swtpm-deps.sh as root)" >&2
    exit 1
  fi
done

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

if [ -f "$dir/swtpm.pid" ] && kill -0 "$(cat "$dir/swtpm.pid")" 2>/dev/null; then
  echo "swtpm-start: swtpm already runs for $dir (pid $(cat "$dir/swtpm.pid")); stop it with scripts/swtpm-stop.sh $dir" >&2
  exit 1
fi
rm -f "$dir/swtpm.pid"

if [ ! -f "$dir/tpm2-00.permall" ]; then
  # A local CA inside DIR: the Debian default config writes under /var/lib.
  ca=$dir/localca
  mkdir -p "$ca"
  cat >"$ca/swtpm-localca.conf" <<CONF
statedir = $ca
signingkey = $ca/signkey.pem
issuercert = $ca/issuercert.pem
certserial = $ca/certserial
CONF
  cat >"$ca/swtpm-localca.options" <<CONF
--platform-manufacturer nodetrust
--platform-version 1.0
--platform-model swtpm
CONF
  cat >"$dir/swtpm_setup.conf" <<CONF
create_certs_tool = /usr/bin/swtpm_localca
create_certs_tool_config = $ca/swtpm-localca.conf
create_certs_tool_options = $ca/swtpm-localca.options
active_pcr_banks = sha256
CONF
  if ! swtpm_setup --tpm2 --tpmstate "$dir" --config "$dir/swtpm_setup.conf" \
    --createek --create-ek-cert --create-platform-cert --ecc --pcr-banks sha256 \
    --rsa-keysize "$rsa_keysize" \
    --overwrite --logfile "$dir/swtpm_setup.log" >/dev/null 2>&1; then
    echo "swtpm-start: swtpm_setup failed; its log:" >&2
    cat "$dir/swtpm_setup.log" >&2 || true
    exit 1
  fi
fi

swtpm socket --tpm2 \
  --server "type=tcp,port=$port,bindaddr=127.0.0.1" \
  --ctrl "type=tcp,port=$ctrl,bindaddr=127.0.0.1" \
  --tpmstate "dir=$dir" \
  --flags not-need-init,startup-clear \
  --log "file=$dir/swtpm.log" \
  --daemon --pid "file=$dir/swtpm.pid"

# swtpm forks once it listens; wait for the pid file and the port anyway.
for _ in $(seq 1 100); do
  if [ -s "$dir/swtpm.pid" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "swtpm-start: swtpm (pid $(cat "$dir/swtpm.pid")) serves tcp://127.0.0.1:$port" >&2
    exit 0
  fi
  sleep 0.05
done
echo "swtpm-start: swtpm did not come up on 127.0.0.1:$port; its log:" >&2
cat "$dir/swtpm.log" >&2 || true
exit 1
