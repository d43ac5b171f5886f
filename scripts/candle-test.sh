#!/usr/bin/env bash
# The candle example (issue 39, item 4): builds ncclrun and examples-candle
# (a workspace of its own, so candle is built only here) into one target
# directory, then runs its tests: candle_ddp through ncclrun at 1, 2 and 4
# ranks, with bit-identical parameters across ranks and the 1-rank loss
# curve matched to 1e-5 relative, for AdamW and for SGD with momentum.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ensure_toolchain
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
T=${CARGO_TARGET_DIR:-$PWD/target}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
cargo build --release -p nccl-perf --bin ncclrun --target-dir "$T"
M=examples-candle/Cargo.toml
start=$(date +%s)
cargo build --release --manifest-path $M --target-dir "$T" --all-targets
echo "candle example built in $(( $(date +%s) - start )) s"
NCCLRUN="$T/release/ncclrun" timeout 600 cargo test --release --manifest-path $M --target-dir "$T"
echo "-- the program, 4 ranks:"
timeout 120 "$T/release/ncclrun" -n 4 --timeout 100 "$T/release/candle_ddp" --epochs 3 --progress never
