#!/usr/bin/env bash
# Measures nccl-rs against Open MPI and Gloo on this machine, in one run, and
# prints a markdown table of bus bandwidth (GB/s) and time per op.
# nccl-rs runs three ways: shared memory and TCP on plain heap buffers, and
# shared memory with -R 1 (buffers from ncclMemAlloc: zero-copy collectives).
# Each size runs nccl-rs's three ways and Open MPI's two back to back (Gloo,
# slow to start, once per collective), so a ratio compares runs seconds apart.
# nccl-rs rows record out-of-place and in-place times; the summary compares
# broadcast in place (MPI_Bcast and torch's broadcast have one buffer) and
# everything else out of place (as MPI's calls; torch's all_reduce is in
# place, so that comparison is conservative).
#   REPS=3 NS="2 4" OPS="allreduce allgather reduce_scatter broadcast alltoall" bash scripts/compare.sh
# OURS="shm tcp shm-R shm-H" adds heap buffers registered onto huge pages
# (the perf tools' -H 1, as ncclCommRegister does) as a fourth way.
# Needs the peers (bash ../shared/peers/setup.sh) and release binaries.
set -u
cd "$(dirname "$0")/.."
PEERS=${PEERS:-../shared/peers}
BIN=${BIN:-/tmp/peers}; VENV=${VENV:-/tmp/peers/venv}
REPS=${REPS:-3}; NS=${NS:-"2 4"}; T=${T:-0.3}; OURS=${OURS:-"shm tcp shm-R"}
OPS=${OPS:-"allreduce allgather reduce_scatter broadcast alltoall"}
SIZES=${SIZES:-"8 1024 65536 1048576 16777216 67108864"}
OUT=${OUT:-/tmp/nccl-rs-compare.txt}
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
. scripts/perf-tools.sh
csv=$(echo $SIZES | tr ' ' ,)
: > "$OUT"
# The host's copy floors (memcpy and process_vm_readv, one core), at the
# start and the end of the run: the bounds of the single-copy paths; and
# loopback TCP's (tcp_floor: one message between two processes over 3
# striped sockets, copied or spliced, and copied both ways at once), under
# the TCP rows.
FLOOR=${OUT%.txt}-floor.txt
floor() { echo "=== copy_floor $1, load $(cut -d' ' -f1-3 /proc/loadavg)"; target/release/copy_floor -b 64K -e 64M -f 4 2>&1;
  echo "=== copy_floor $1 at distance 4 (rep movsb's slow distances; nccl-rs avoids them)"; target/release/copy_floor -b 64K -e 1M -f 4 -d 4 2>&1;
  echo "=== copy_floor $1 in transparent huge pages (process_vm_readv pins one page per 2 MiB instead of 512)"; target/release/copy_floor -b 1M -e 64M -f 4 --thp 2>&1;
  echo "=== tcp_floor $1 (the kernel's loopback TCP, nothing of nccl-rs between)"; target/release/tcp_floor -b 64K -e 64M -f 4 -m plain,splice,both 2>&1; }
# Where the host put the two vCPUs right now: a cache-line round trip between
# them, in ns (copy_floor --pair), recorded with every section.
pair() { target/release/copy_floor --pair 2>/dev/null || echo "?"; }
floor start > "$FLOOR"
for r in $(seq 1 "$REPS"); do
  for N in $NS; do
    for op in $OPS; do
      # Each size: nccl-rs's three ways and Open MPI's two back to back, within
      # seconds, so that both ends of a ratio share the host's state (it moves
      # the vCPUs between shared and separate caches every few seconds).
      for s in $SIZES; do
        # About as long as the peers' T seconds per size (short runs read high).
        iters=20; [ "$s" -le 16777216 ] && iters=60; [ "$s" -le 1048576 ] && iters=2000
        [ "$s" -le 65536 ] && iters=10000; [ "$s" -le 1024 ] && iters=20000
        warm=$((iters / 20)); [ $warm -lt 20 ] && warm=20
        # A size that leaves no float per rank (8 B at 4 ranks) is one float per
        # rank instead, as the peers' benches round it up (our tools round down).
        so=$s; case $op in allgather|alltoall|reduce_scatter) [ "$s" -lt $((N * 4)) ] && so=$((N * 4));; esac
        head="N=$N op $op size $s load $(cut -d' ' -f1-3 /proc/loadavg) pair $(pair) ns"
        for cfg in $OURS; do
          env=(); [ $cfg = tcp ] && env=(NCCL_SHM_DISABLE=1)
          reg=0; [ $cfg = shm-R ] && reg=1
          huge=0; [ $cfg = shm-H ] && huge=1
          echo "=== rep $r cfg nccl-rs-$cfg $head" >> "$OUT"
          env "${env[@]}" NCCL_SOCKET_IFNAME=lo timeout 300 target/release/ncclrun -n $N target/release/$(tool $op) \
            -b $so -e $so -n $iters -w $warm -c 0 -R $reg -H $huge 2>&1 | grep -E '^ +[0-9]' | awk '{print $1, $2, $6, $8, $10, $12}' >> "$OUT"
        done
        echo "=== rep $r cfg mpi-shm $head" >> "$OUT"
        timeout 300 $MPIRUN -np $N "$BIN/mpi_bench" -s $s -o $op -t $T 2>&1 | grep -E '^ +[0-9]' | awk '{print $1, $2, $4, $6}' >> "$OUT"
        echo "=== rep $r cfg mpi-tcp $head" >> "$OUT"
        timeout 300 $MPIRUN -np $N --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "$BIN/mpi_bench" -s $s -o $op -t $T 2>&1 \
          | grep -E '^ +[0-9]' | awk '{print $1, $2, $4, $6}' >> "$OUT"
      done
      # Gloo takes seconds to start (Python, torch): all sizes in one run.
      echo "=== rep $r cfg gloo N=$N op $op load $(cut -d' ' -f1-3 /proc/loadavg) pair $(pair) ns" >> "$OUT"
      GLOO_SOCKET_IFNAME=lo timeout 600 "$VENV/bin/python" "$PEERS/gloo_bench.py" -n $N -s $csv -o $op -t $T 2>&1 \
        | grep -E '^ +[0-9]' | awk '{print $1, $2, $4, $6}' >> "$OUT"
    done
  done
done
floor end >> "$FLOOR"
python3 scripts/compare_summary.py "$OUT"
echo; echo "Copy and TCP floors of this host (target/release/copy_floor, tcp_floor; $FLOOR):"; grep -v '^#' "$FLOOR"
echo; grep -o 'pair [0-9]* ns' "$OUT" | awk '{n++; if ($2 > 200) far++} END {if (n) printf "vCPU placement (copy_floor --pair before each section): %d sections, %d (%.0f%%) with the two CPUs apart (round trip over 200 ns)\n", n, far, 100*far/n}'
