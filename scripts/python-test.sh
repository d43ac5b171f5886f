#!/usr/bin/env bash
# The Python package's stage: builds and installs `nccl_rs` (pip install
# ./python) into a venv with numpy and pytest from PyPI, then runs its tests
# (real processes at 2 and 4 ranks on 127.0.0.1).
#   NCCL_RS_VENV=DIR   the venv (default target/venv; created if missing)
#   CARGO_TARGET_DIR   cargo's build folder (default target/, shared with the
#                      workspace build so that dependencies are reused)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ensure_toolchain
ensure_packages python3:python3
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "== installing python3-venv"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3-venv >/dev/null
fi
venv="${NCCL_RS_VENV:-target/venv}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
echo "== python: $("$py" --version), venv $venv"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q numpy pytest
start=$(date +%s)
"$py" -m pip install -q ./python
echo "== pip install ./python took $(( $(date +%s) - start ))s"
"$py" -m pytest python/tests --ignore=python/tests/torch_backend -q -p no:cacheprovider
