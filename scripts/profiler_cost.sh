#!/usr/bin/env bash
# The cost of the profiler plugin interface on an 8 B all-reduce at 2 ranks
# (processes, shared memory): R rounds (default 7), each running
# all_reduce_perf back to back with no plugin (NCCL_PROFILER_PLUGIN=none),
# with a plugin that does nothing and activates no event (mask 0), and with
# one that does nothing for every event (mask 0xfff: over shared memory
# Group, Coll and KernelCh; ProxyOps, ProxySteps and NetPlugin events are
# for network peers only, as in NCCL). Prints each round, then per configuration the
# median time and its ratio to no plugin.
#   bash scripts/profiler_cost.sh [R]      (ITERS=n sets the iterations)
# Expects release binaries in $CARGO_TARGET_DIR/release (default target/release).
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-7}; ITERS=${ITERS:-20000}
B=${CARGO_TARGET_DIR:-target}/release
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_RS_TIMEOUT=${NCCL_RS_TIMEOUT:-60}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
${CC:-cc} -O2 -shared -fPIC -I nccl-rs/src/profiler/include -o "$tmp/libnoop.so" tests/profiler/noop.c
names=(none mask0 all)
envs=("NCCL_PROFILER_PLUGIN=none" "NCCL_PROFILER_PLUGIN=$tmp/libnoop.so PROF_MASK=0" "NCCL_PROFILER_PLUGIN=$tmp/libnoop.so PROF_MASK=0xfff")
declare -A times
one() { # env... -> out-of-place time (us)
  env "$@" timeout 120 "$B/ncclrun" -n 2 "$B/all_reduce_perf" -b 8 -e 8 -n "$ITERS" -w $((ITERS / 10)) -P out 2>&1 |
    awk '$1 == 8 && $2 == 2 { print $6 }'
}
for r in $(seq "$R"); do
  line="round $r:"
  for i in "${!names[@]}"; do
    t=$(one ${envs[$i]})
    [ -n "$t" ] || { echo "all_reduce_perf failed (${envs[$i]})"; exit 1; }
    times[${names[$i]}]+="$t "
    line+=" ${names[$i]} $t us"
  done
  echo "$line"
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
base=$(echo "${times[none]}" | median)
for n in "${names[@]}"; do
  m=$(echo "${times[$n]}" | median)
  awk -v n="$n" -v m="$m" -v b="$base" 'BEGIN { printf "%-6s median %.3f us  (%+.1f%% vs no plugin)\n", n, m, (m / b - 1) * 100 }'
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
