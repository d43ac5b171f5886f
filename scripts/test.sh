#!/usr/bin/env bash
# Runs the whole test suite; installs what it needs first.
#   NCCL_RS_FULL_MATRIX=1   run the full collective matrix instead of the seeded sample
#   NCCL_RS_TEST_SEED=N     seed of the sample and of the test data (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ensure_toolchain
# g++: the GPU reduction kernels' source is also built for the CPU and checked bit for bit.
ensure_packages g++:g++
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
echo "== cargo $(cargo --version | cut -d' ' -f2), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
cargo build --release --workspace --all-targets
cargo test --release --workspace
echo "== the cuda feature (no GPU here: driver-absent and fake-driver tests)"
cargo test --release -p nccl-rs -p nccl-ffi -p nccl-perf --features nccl-rs/cuda,nccl-ffi/cuda,nccl-perf/cuda
echo "== C ABI test programs under valgrind"
bash scripts/valgrind-ffi.sh
echo "== perf tools: every collective at 2 ranks with data checks"
bash scripts/perf-check.sh
echo "== RAS: a stopped rank named by ncclras within 2 s (loopback text form; as root 8 ranks on 4 namespaces, JSON)"
bash scripts/ras-test.sh
echo "== RAS telemetry: 4 ranks on 4 namespaces, exact per-peer bytes through RAS, 5% loss into one rank named by its link's retransmits"
bash scripts/ras-telemetry-test.sh
echo "== fabric simulator: 16k-rank scale and validation against the fabric table"
bash scripts/sim-check.sh
echo "== candle example: candle_ddp at 1, 2 and 4 ranks through ncclrun (examples-candle, its own workspace)"
bash scripts/candle-test.sh
echo "== Python package: pip install ./python, pytest"
bash scripts/python-test.sh
echo "== torch backend: python/tests/torch_backend against Gloo at 2 and 4 ranks, DDP on digits"
bash scripts/torch-test.sh
if [ "$(id -u)" = 0 ]; then
  echo "== emulated fabric: the exact matrix at 4 hosts x 2 ranks, 2 rails, 2 leaves, through ncclrun -H --rsh 'ip netns exec'"
  bash scripts/fabric/matrix.sh
  echo "== emulated fabric: fabric_check names a NIC at 1/4 rate and a host losing 5%, passes 5 clean runs"
  bash scripts/fabric/check-test.sh
else
  echo "== emulated fabric stage skipped (needs root for network namespaces)"
fi
if [ "$(id -u)" = 0 ] && [ "${NCCL_RS_SKIP_RXE:-0}" != 1 ]; then
  echo "== soft-RoCE: verbs tests, collectives at 2 and 4 ranks and all_reduce_perf over rxe0 in a QEMU guest"
  bash scripts/rxe/run.sh
  echo "== soft-RoCE: two guests across a lossy link (netem 1%)"
  bash scripts/rxe/two-guests.sh
  echo "== soft-RoCE: two rxe devices as rails (transport tests, striping, collectives over both)"
  RXE_RAILS_COLL=1 bash scripts/rxe/rails.sh
else
  echo "== soft-RoCE stage skipped (needs root; NCCL_RS_SKIP_RXE=${NCCL_RS_SKIP_RXE:-0})"
fi
