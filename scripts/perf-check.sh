#!/usr/bin/env bash
# Runs every perf tool with data checks (-c 1) at small sizes, as processes
# (ncclrun) and as threads (-t), and fails if any reports a wrong element or
# an error. Expects release binaries in target/release.
set -euo pipefail
cd "$(dirname "$0")/.."
B=target/release
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_RS_TIMEOUT=${NCCL_RS_TIMEOUT:-60}
run() { echo "-- $*"; timeout 300 "$@" > /tmp/perf-check.log 2>&1 || { cat /tmp/perf-check.log; echo "FAILED: $*"; exit 1; }; tail -n 3 /tmp/perf-check.log; }
for tool in all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf sendrecv_perf gather_perf scatter_perf; do
  run $B/ncclrun -n 2 $B/$tool -b 8 -e 4M -f 8 -n 3 -w 1 -c 1
  run $B/$tool -t 3 -b 8 -e 1M -f 16 -n 2 -w 1 -c 1 -r 1
done
run $B/ncclrun -n 3 $B/all_reduce_perf -b 8 -e 64K -f 64 -n 1 -w 0 -c 1 -d all -o all
# One measurement per size (-P): each alone, with its data checked.
run $B/ncclrun -n 2 $B/alltoall_perf -b 1K -e 1M -f 32 -n 2 -w 1 -c 1 -P in
run $B/ncclrun -n 2 $B/all_reduce_perf -b 1K -e 1M -f 32 -n 2 -w 1 -c 1 -P out
run $B/ncclrun -n 3 $B/reduce_scatter_perf -b 64 -e 64K -f 32 -n 1 -w 0 -c 1 -d all -o all
# Shared buffers (-R 1): the zero-copy path, up to outputs large enough for
# streaming stores (32 MiB and more), and send/recv read through a mapping of
# the sender's buffer; -c 1 checks every rank's data.
for tool in all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf gather_perf scatter_perf sendrecv_perf; do
  run $B/ncclrun -n 2 $B/$tool -b 16K -e 64M -f 64 -n 2 -w 1 -c 1 -R 1
done
run $B/ncclrun -n 3 $B/all_reduce_perf -b 96K -e 96K -n 1 -w 0 -c 1 -d all -o all -R 1
echo "perf tools: all checks passed"
