#!/usr/bin/env bash
# The main job: a local 4-rank all-reduce sweep over the default transport
# (shared memory between ranks of one host; NCCL_SHM_DISABLE=1 for TCP on
# loopback), printed as an nccl-tests table. Extra arguments go to
# all_reduce_perf (e.g. -b 8 -e 1G -f 2 -d half).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ensure_toolchain
cargo build --release -q -p nccl-perf
NP=${NP:-4}
exec target/release/ncclrun -n "$NP" target/release/all_reduce_perf -b 8 -e 128M -f 2 "$@"
