#!/usr/bin/env bash
# Installs the Debian packages the swtpm integration tests need (swtpm,
# swtpm-tools, tpm2-tools) when run as root; otherwise names what is missing.
# Safe to run again.
set -euo pipefail
packages=(swtpm swtpm-tools tpm2-tools)
commands=(swtpm swtpm_setup tpm2_createek)
missing=()
for i in "${!packages[@]}"; do
  command -v "${commands[$i]}" >/dev/null 2>&1 || missing+=("${packages[$i]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "swtpm-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "swtpm-deps: missing Debian packages: ${missing[*]} (run $0 as root)" >&2
  exit 1
fi
