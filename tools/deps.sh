#!/bin/bash
# Installs the Debian packages cohort needs, only those missing. Idempotent;
# waits for the apt lock (other work may hold it) instead of failing.
set -euo pipefail
PKGS=(build-essential pkg-config libnng-dev libprotobuf-c-dev protobuf-c-compiler openssl
      check libsubunit-dev libmbedtls-dev iproute2 nftables valgrind
      clang-format clang
      # the status page's test runs it headless (docs/observability.md)
      chromium)
# Peers for `make bench` only.
if [[ "${COHORT_DEPS_BENCH:-0}" == 1 ]]; then
	PKGS+=(libgloo-dev libopenmpi-dev openmpi-bin)
fi
# The Python suite's venv (tools/pyenv.sh): Debian's python3 needs
# python3-venv; a python3 that already makes venvs needs nothing.
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
	PKGS+=(python3 python3-venv)
fi
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
	echo "deps: all ${#PKGS[@]} packages present"
	exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=
if [[ $(id -u) != 0 ]]; then
	if command -v sudo >/dev/null; then SUDO="sudo -n"; else
		echo "deps: not root and no sudo; install: ${missing[*]}" >&2; exit 1
	fi
fi
APT=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get "${APT[@]}" update -q || true
$SUDO apt-get "${APT[@]}" install -y -q --no-install-recommends "${missing[@]}"
