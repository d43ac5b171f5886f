#!/usr/bin/env bash
# Builds everything the GPU check needs, here (Rust toolchain and a C
# compiler; no CUDA toolkit, no GPU), and packs it with scripts/gpu-check.sh
# into one tarball for a machine with an NVIDIA GPU and no Rust toolchain:
#
#   bash scripts/gpu-bundle.sh [OUT.tar.gz]      (default: target/gpu-bundle.tar.gz)
#   # copy it over, then there:
#   tar xzf gpu-bundle.tar.gz && bash gpu-bundle/gpu-check.sh
#
# The bundle (gpu-bundle/):
#   lib/libnccl.so.2, lib/libnccl.so   our NCCL (release, --features cuda)
#   include/nccl.h
#   bin/device_check                   C program: collectives on device buffers
#                                      through NCCL's C API, exact checks, perf sweep
#   bin/cuda_fake, bin/cuda_gpu        the Rust cuda tests (run on the real GPU)
#   bin/ncclrun, bin/*_perf            the perf tools (--features cuda: --device 1)
#   src/                               the C sources (device_check.c with
#                                      device_check_async.h, fake_libcuda.c),
#                                      to rebuild there if wanted
#   gpu-check.sh, MANIFEST
#   lib/libnvrtc.so.1x (+ builtins)    only with GPU_BUNDLE_NVRTC=/path/libnvrtc.so.13
#                                      (about 120 MB); otherwise gpu-check.sh finds the
#                                      GPU machine's NVRTC (CUDA toolkit or the
#                                      nvidia-cuda-nvrtc wheel) for the GPU reductions
# The reduction kernels' source is inside libnccl (compiled there with NVRTC).
# Honours CARGO_TARGET_DIR. Needs python3 (to read cargo's JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:-}
target=${CARGO_TARGET_DIR:-$root/target}
[ -n "$out" ] || out=$target/gpu-bundle.tar.gz
case $out in /*) ;; *) out=$root/$out ;; esac

echo "== building libnccl (release, --features cuda)"
cargo build --release -p nccl-ffi --features cuda
echo "== building the perf tools (release, --features cuda)"
cargo build --release -p nccl-perf --features cuda
echo "== building the Rust cuda tests (release)"
tests_json=$(cargo test --release -p nccl-rs --features cuda --test cuda_fake --test cuda_gpu \
  --no-run --message-format=json 2>/dev/null)
exe_of() {
  printf '%s\n' "$tests_json" | python3 -c '
import json, sys
name = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == name:
        print(m["executable"])
' "$1" | tail -1
}
fake_exe=$(exe_of cuda_fake)
gpu_exe=$(exe_of cuda_gpu)
if [ ! -x "$fake_exe" ] || [ ! -x "$gpu_exe" ]; then
  echo "gpu-bundle: test binaries not found" >&2
  exit 1
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b=$stage/gpu-bundle
mkdir -p "$b/lib" "$b/include" "$b/bin" "$b/src"
cp "$target/release/libnccl.so" "$b/lib/libnccl.so.2"
ln -s libnccl.so.2 "$b/lib/libnccl.so"
cp ffi/include/nccl.h "$b/include/"
cp ffi/tests/cuda/device_check.c ffi/tests/cuda/device_check_async.h ffi/tests/cuda/fake_libcuda.c "$b/src/"
echo "== compiling device_check (from the bundle's src/, so it is complete)"
cc -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -Wall -Wextra -Werror -O2 \
  -I "$b/include" "$b/src/device_check.c" -o "$b/bin/device_check" \
  -L "$b/lib" -lnccl -ldl -lpthread
cp "$fake_exe" "$b/bin/cuda_fake"
cp "$gpu_exe" "$b/bin/cuda_gpu"
for t in ncclrun all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf sendrecv_perf; do
  cp "$target/release/$t" "$b/bin/$t"
done
cp scripts/gpu-check.sh "$b/gpu-check.sh"
if [ -n "${GPU_BUNDLE_NVRTC:-}" ]; then
  echo "== bundling NVRTC from $GPU_BUNDLE_NVRTC"
  cp -L "$GPU_BUNDLE_NVRTC" "$b/lib/"
  # Its RUNPATH is $ORIGIN: the builtins library goes beside it.
  cp -L "$(dirname "$GPU_BUNDLE_NVRTC")"/libnvrtc-builtins.so.* "$b/lib/" 2>/dev/null || true
fi
chmod +x "$b/gpu-check.sh"

glibc_needed=$(for f in "$b/lib/libnccl.so.2" "$b/bin/"*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
{
  echo "built:        $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"'))"
  echo "git:          $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "rustc:        $(rustc --version)"
  echo "glibc_needed: ${glibc_needed:-?}"
} > "$b/MANIFEST"
cat "$b/MANIFEST"

# A quick self-test of the bundle on the fake driver, so a broken bundle is
# caught here, not on the GPU machine.
echo "== self-test on the fake CUDA driver"
cc -shared -fPIC -O1 -pthread -Wl,-soname,libcuda.so.1 ffi/tests/cuda/fake_libcuda.c -o "$stage/libcuda.so.1"
LD_LIBRARY_PATH=$b/lib NCCL_RS_CUDA_DRIVER=$stage/libcuda.so.1 NCCL_SOCKET_IFNAME=lo NCCL_RS_CUDA_STAGING_CHUNK=256K \
  timeout 300 "$b/bin/device_check" 2 | tail -1
NCCL_RS_CUDA_DRIVER=$stage/libcuda.so.1 NCCL_SOCKET_IFNAME=lo \
  timeout 300 "$b/bin/ncclrun" -n 2 "$b/bin/all_reduce_perf" --device 1 -b 8 -e 1M -f 32 -c 1 -n 2 |
  grep -F '# Out of bounds values : 0 OK'

mkdir -p "$(dirname "$out")"
tar -C "$stage" -czf "$out" gpu-bundle
echo "== $out ($(du -h "$out" | cut -f1))"
