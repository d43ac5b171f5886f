#!/usr/bin/env bash
# The device check of the `cuda` feature, on a machine with an NVIDIA GPU
# (CUDA 12.8+ or 13 driver; no Rust toolchain and no network needed).
# Run from the unpacked bundle that scripts/gpu-bundle.sh made:
#
#   tar xzf gpu-bundle.tar.gz && bash gpu-bundle/gpu-check.sh
#
# It runs, with device buffers and NCCL's stream semantics, exact results:
#   1. bin/device_check 2 and 4: all-reduce (out of place; in place int32
#      max), all-gather (also in place), reduce-scatter, broadcast, a
#      send/recv ring plus self send/recv, ncclMemAlloc giving device
#      memory: 2 and 4 ranks sharing the GPU, through our libnccl.so.2
#   2. the same at 2 ranks with whole-buffer staging (NCCL_RS_CUDA_PIPELINE=0)
#   3. the Rust tests on the real GPU: bin/cuda_fake (every collective,
#      in-place layouts, stream ordering, PreMulSum, host/device p2p,
#      DMA-BUF probe) with NCCL_RS_CUDA_TESTS=real, and bin/cuda_gpu
#   3b. reductions on the GPU (NCCL_RS_CUDA_REDUCE=gpu: kernels compiled at
#      run time with NVRTC, found below): device_check 2 with the INFO line
#      that names the path, and bin/cuda_fake again with the GPU path
#      forced (bit-exact against the host kernels folded in rank order)
#   4. an all-reduce sweep on device buffers at 2 and 4 ranks (ours);
#      4b. bin/all_reduce_perf --device 1 under bin/ncclrun at 2 ranks
#   5. if the Python package nvidia-nccl-cu13 (or -cu12) is installed: the
#      same program on NVIDIA's libnccl.so.2 (1 rank: NVIDIA's NCCL allows
#      one rank per GPU), next to ours at 1 rank
# in about 2-4 minutes (each step has a deadline; the whole < 8 minutes).
# Everything is logged to gpu-check.log beside this script. Exit status 0
# when every required step passed (step 5 is informational).
#
# NVRTC: NCCL_RS_NVRTC_LIBRARY if set, else lib/ of the bundle, the Python
# packages nvidia-cuda-nvrtc (-cu12/-cu13), the dynamic linker's cache,
# /usr/local/cuda*/lib64 and targets/*/lib. Without NVRTC step 3b fails
# (the host path is checked by the other steps).
#
# Environment: GPU_CHECK_PERF_MAX (default 256M), GPU_CHECK_SKIP_NVIDIA=1,
# GPU_CHECK_FAKE_DRIVER=path (a dry run on the fake driver, no GPU).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log=$here/gpu-check.log
exec > >(tee "$log") 2>&1
start=$(date +%s)
fails=()
passes=()

# Our library first on the search path (the binaries carry no rpath, so
# the NVIDIA comparison can swap libraries the same way).
ours=(env "LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export NCCL_RS_TIMEOUT=${NCCL_RS_TIMEOUT:-120}
unset NCCL_RS_CUDA_DISABLE
# GPU_CHECK_FAKE_DRIVER=/path/libcuda.so.1 (built from src/fake_libcuda.c):
# a dry run of this script on a machine without a GPU.
fake=${GPU_CHECK_FAKE_DRIVER:-}
if [ -n "$fake" ]; then
  export NCCL_RS_CUDA_DRIVER=$fake
else
  unset NCCL_RS_CUDA_DRIVER
fi

step() { # name, deadline seconds, command...
  local name=$1 limit=$2
  shift 2
  echo
  echo "=== $name  (deadline ${limit}s, at +$(($(date +%s) - start))s)"
  local t0
  t0=$(date +%s)
  if timeout --kill-after=10 "$limit" "$@"; then
    echo "--- PASS: $name ($(($(date +%s) - t0))s)"
    passes+=("$name")
  else
    echo "--- FAIL: $name (exit $?, $(($(date +%s) - t0))s)"
    fails+=("$name")
  fi
}

echo "=== gpu-check of nccl-rs, $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
[ -z "$fake" ] || echo "=== DRY RUN on the fake driver $fake: this checks the script, not a GPU"
cat "$here/MANIFEST" 2>/dev/null
have=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9]\+\.[0-9]\+$')
need=$(sed -n 's/^glibc_needed: *//p' "$here/MANIFEST" 2>/dev/null)
echo "glibc here:   ${have:-?}"
if [ -n "$have" ] && [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  echo "gpu-check: this machine's glibc $have is older than the bundle needs ($need); build the bundle on an older distribution" >&2
  exit 2
fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv 2>&1 | sed 's/^/nvidia-smi: /'
  nvidia-smi topo -m 2>/dev/null | head -5 | sed 's/^/nvidia-smi: /'
else
  echo "nvidia-smi: not found"
fi
lsmod 2>/dev/null | grep -E '^(nvidia_peermem|nv_peer_mem)' | sed 's/^/module: /'

# 1, 2: device buffers through the C API.
step "device_check 2 ranks (INFO log)" 150 "${ours[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
  "$here/bin/device_check" 2
step "device_check 4 ranks" 180 "${ours[@]}" "$here/bin/device_check" 4
step "device_check 2 ranks, whole-buffer staging" 120 "${ours[@]}" NCCL_RS_CUDA_PIPELINE=0 \
  "$here/bin/device_check" 2

# NVRTC for the reductions on the GPU (steps 3 and 3b).
find_nvrtc() {
  if [ -n "${NCCL_RS_NVRTC_LIBRARY:-}" ]; then
    echo "$NCCL_RS_NVRTC_LIBRARY"
    return
  fi
  local c
  for c in "$here"/lib/libnvrtc.so.13 "$here"/lib/libnvrtc.so.12; do
    [ -e "$c" ] && { echo "$c"; return; }
  done
  if command -v python3 >/dev/null; then
    c=$(python3 - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
for root in list(getattr(nvidia, "__path__", [])):
    for pat in ("cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.13",
                "cuda_nvrtc/lib/libnvrtc.so.12", "*/lib/libnvrtc.so.1[23]"):
        hits = sorted(glob.glob(os.path.join(root, pat)))
        if hits:
            print(hits[0])
            raise SystemExit
EOF
    )
    [ -n "$c" ] && { echo "$c"; return; }
  fi
  c=$(ldconfig -p 2>/dev/null | grep -o '/[^ ]*libnvrtc\.so\.1[23]$' | sort -r | head -1)
  [ -n "$c" ] && { echo "$c"; return; }
  for c in /usr/local/cuda/lib64/libnvrtc.so.1[23] /usr/local/cuda-1[23]*/lib64/libnvrtc.so.1[23] \
    /usr/local/cuda*/targets/*/lib/libnvrtc.so.1[23]; do
    [ -e "$c" ] && { echo "$c"; return; }
  done
}
# device_check with the GPU path forced; prints which path the INFO line names.
reduce_path_check() {
  local out rc
  out=$("${ours[@]}" NCCL_RS_CUDA_REDUCE=gpu NCCL_DEBUG=INFO "$here/bin/device_check" 2 2>&1)
  rc=$?
  printf '%s\n' "$out" | tail -20
  echo "reduction path: $(printf '%s\n' "$out" | grep -o 'device reductions: on the .*' | head -1)"
  [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q 'device reductions: on the GPU'
}
nvrtc=$(find_nvrtc)
[ -n "$nvrtc" ] && [ -z "$fake" ] && export NCCL_RS_NVRTC_LIBRARY=$nvrtc

# 3: the Rust tests on the real GPU (on the fake driver, less the two that
# expect kernels to run).
skip=()
[ -n "$fake" ] && skip=(--skip device_reductions_fall_back --skip forced_gpu_reduction_without_kernels)
step "Rust cuda tests on the GPU (cuda_fake, NCCL_RS_CUDA_TESTS=real)" 180 \
  env NCCL_RS_CUDA_TESTS=real "$here/bin/cuda_fake" --test-threads=1 "${skip[@]}"
# (cudarc's typed layer loads every symbol of its bindings: not the fake's.)
[ -n "$fake" ] ||
  step "Rust cuda tests (cuda_gpu --ignored)" 120 "$here/bin/cuda_gpu" --ignored --test-threads=1 --nocapture

# 3b: reductions on the GPU (NCCL_RS_CUDA_REDUCE=gpu).
echo
if [ -n "$fake" ]; then
  echo "=== reductions on the GPU: not on the fake driver (no kernels run there)"
elif [ -n "$nvrtc" ]; then
  echo "=== NVRTC: $nvrtc"
  step "device_check 2 ranks, reductions on the GPU (NCCL_RS_CUDA_REDUCE=gpu)" 150 reduce_path_check
  step "Rust cuda tests, reductions on the GPU (NCCL_RS_CUDA_REDUCE=gpu)" 180 \
    env NCCL_RS_CUDA_TESTS=real NCCL_RS_CUDA_REDUCE=gpu "$here/bin/cuda_fake" --test-threads=1 --nocapture
else
  echo "=== NVRTC not found (no CUDA toolkit, no nvidia-cuda-nvrtc wheel; set NCCL_RS_NVRTC_LIBRARY)"
  fails+=("reductions on the GPU: NVRTC not found")
fi

# 4: all-reduce sweeps on device buffers.
max=${GPU_CHECK_PERF_MAX:-256M}
step "all-reduce perf, 2 ranks on device buffers (ours)" 150 "${ours[@]}" "$here/bin/device_check" 2 perf 1K "$max" 5
step "all-reduce perf, 4 ranks on device buffers (ours)" 150 "${ours[@]}" "$here/bin/device_check" 4 perf 1K 64M 5

# 4b: the perf tool on device buffers (nccl-tests style, -c 1 checks).
[ ! -x "$here/bin/ncclrun" ] ||
  step "all_reduce_perf --device 1, 2 ranks under ncclrun" 120 "$here/bin/ncclrun" -n 2 \
    "$here/bin/all_reduce_perf" --device 1 -b 8 -e 64M -f 8 -c 1 -n 5 -w 2

# 5: NVIDIA's NCCL, same program, if the Python package is there.
nvdir=""
if [ -z "$fake" ] && [ "${GPU_CHECK_SKIP_NVIDIA:-0}" != 1 ] && command -v python3 >/dev/null; then
  nvdir=$(python3 - <<'EOF' 2>/dev/null
import importlib, os
for mod in ("nvidia.nccl",):
    try:
        m = importlib.import_module(mod)
    except ImportError:
        continue
    for p in list(getattr(m, "__path__", [])):
        lib = os.path.join(p, "lib")
        if os.path.exists(os.path.join(lib, "libnccl.so.2")):
            print(lib)
            raise SystemExit
EOF
  )
fi
if [ -n "$nvdir" ]; then
  echo
  echo "=== NVIDIA NCCL from $nvdir (informational; 1 rank per GPU)"
  info() {
    local name=$1; shift
    echo "--- $name"
    timeout --kill-after=10 120 "$@" || echo "--- (exit $?)"
  }
  info "NVIDIA NCCL: device_check 1" env LD_LIBRARY_PATH="$nvdir" DEVICE_CHECK_LIB="$nvdir/libnccl.so.2" \
    "$here/bin/device_check" 1
  info "NVIDIA NCCL: all-reduce perf, 1 rank" env LD_LIBRARY_PATH="$nvdir" DEVICE_CHECK_LIB=NVIDIA \
    "$here/bin/device_check" 1 perf 1K "$max" 5
  info "ours: all-reduce perf, 1 rank" env LD_LIBRARY_PATH="$here/lib" DEVICE_CHECK_LIB=nccl-rs \
    "$here/bin/device_check" 1 perf 1K "$max" 5
else
  echo
  echo "=== NVIDIA NCCL: python package nvidia-nccl-cu13 not found (skipped)"
fi

echo
echo "=== summary after $(($(date +%s) - start))s: ${#passes[@]} passed, ${#fails[@]} failed"
for p in "${passes[@]}"; do echo "PASS  $p"; done
for f in "${fails[@]}"; do echo "FAIL  $f"; done
[ ${#fails[@]} -eq 0 ] && echo "gpu-check: OK" || echo "gpu-check: FAILED"
[ ${#fails[@]} -eq 0 ]
