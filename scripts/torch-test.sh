#!/usr/bin/env bash
# The torch.distributed backend "nccl_rs": its pytest suite (python/tests/torch_backend)
# against Gloo at 2 and 4 ranks, DDP, FSDP and the ddp_digits example.
#   NCCL_RS_VENV=DIR   the virtual environment (default target/venv; reused if present)
# Installs torch, numpy, scikit-learn and pytest from PyPI, then the nccl_rs
# package (pip install ./python). Without python/pyproject.toml (the package
# not built yet) it runs against libnccl.so from cargo through NCCL_RS_LIBRARY.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ensure_toolchain
VENV=${NCCL_RS_VENV:-target/venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "== installing python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq python3-venv >/dev/null
  fi
  echo "== creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c 'import torch, numpy, sklearn, pytest' >/dev/null 2>&1; then
  echo "== pip install torch numpy scikit-learn pytest (PyPI)"
  "$VPY" -m pip install -q --upgrade pip
  "$VPY" -m pip install -q torch numpy scikit-learn pytest
fi
if [ -f python/pyproject.toml ]; then
  echo "== pip install ./python"
  "$VPY" -m pip install -q ./python
  # the installed package, not the source tree, provides nccl_rs
  unset NCCL_RS_LIBRARY
  export PYTHONPATH=
else
  echo "== python/pyproject.toml absent: the backend loads target/release/libnccl.so"
  cargo build --release -p nccl-ffi
  export NCCL_RS_LIBRARY="${CARGO_TARGET_DIR:-$PWD/target}/release/libnccl.so"
  export PYTHONPATH="$PWD/python"
fi
echo "== pytest python/tests/torch_backend ($("$VPY" -c 'import torch; print("torch", torch.__version__)'))"
start=$(date +%s)
"$VPY" -m pytest -q -p no:cacheprovider "$PWD/python/tests/torch_backend"
echo "== torch tests took $(( $(date +%s) - start )) s"
