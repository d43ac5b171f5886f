#!/usr/bin/env bash
# Where the CPUs go during one collective run: `perf record` of every CPU
# (cpu-clock samples, so it works in a VM without hardware counters) while
# one configuration runs one size, then the share of samples in the kernel,
# in the run's processes and idle, and the top symbols.
#   bash scripts/profile.sh CFG N op size [iters]
# CFG: shm | tcp | shm-R (nccl-rs on heap buffers, NCCL_SHM_DISABLE=1, or
# ncclMemAlloc buffers) | mpi-shm | mpi-tcp (Open MPI's bench from
# BIN_PEERS, default /tmp/peers). op as in scripts/paired.sh. Ours runs out
# of place only, as Open MPI's bench does (broadcast in place, as
# MPI_Bcast); PLACES=both|out|in overrides. TOP=n symbols (default 15);
# OUT=dir keeps perf.data there. Needs perf and release binaries; run on a
# quiet host (the profile takes in everything).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { sed -n 2,14p "$0"; exit 2; }
cfg=$1; N=$2; op=$3; s=$4; PEERS=${BIN_PEERS:-/tmp/peers}
places=out; [ "$op" = broadcast ] && places=in; places=${PLACES:-$places}
iters=${5:-}
if [ -z "$iters" ]; then
  iters=50; [ "$s" -le 16777216 ] && iters=200; [ "$s" -le 1048576 ] && iters=3000
  [ "$s" -le 65536 ] && iters=20000
fi
command -v perf > /dev/null || { echo "profile.sh: needs perf (apt-get install linux-perf)"; exit 1; }
. scripts/perf-tools.sh
tool "$op" > /dev/null  # an unknown op ends here
if [ -n "${OUT:-}" ]; then out=$OUT; else out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; fi
data=$out/perf.data
MPIRUN="mpirun --allow-run-as-root --oversubscribe -np $N"
case $cfg in
  shm|tcp|shm-R)
    env=(NCCL_SOCKET_IFNAME=lo); [ "$cfg" = tcp ] && env+=(NCCL_SHM_DISABLE=1)
    reg=0; [ "$cfg" = shm-R ] && reg=1
    cmd=(env "${env[@]}" target/release/ncclrun -n "$N" "target/release/$(tool "$op")" -b "$s" -e "$s"
      -n "$iters" -w 5 -c 0 -R $reg -P "$places")
    comms="ncclrun,$(tool "$op")";;
  mpi-shm) cmd=($MPIRUN "$PEERS/mpi_bench" -s "$s" -o "$op" -t 2); comms=mpi_bench;;
  mpi-tcp) cmd=($MPIRUN --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "$PEERS/mpi_bench" -s "$s" -o "$op" -t 2)
    comms=mpi_bench;;
  *) echo "profile.sh: unknown configuration $cfg"; exit 2;;
esac
echo "== $cfg N=$N $op $s: ${cmd[*]}"
perf record -q -e cpu-clock -a -o "$data" -- timeout 300 "${cmd[@]}" 2>&1 | grep -E '^ +[0-9]' || true
# Shares: the run's own processes in user space and in the kernel, idle,
# and everything else (other processes, interrupts).
perf report -i "$data" --stdio --no-children --sort comm,dso -F overhead,comm,dso 2>/dev/null \
  | awk -v comms="$comms" '
    BEGIN { n = split(comms, c, ","); for (i = 1; i <= n; i++) ours[c[i]] = 1 }
    /^ *[0-9.]+%/ { p = $1; sub("%", "", p); comm = $2; dso = $3
      if (comm == "swapper") idle += p
      else if (comm in ours && dso == "[kernel.kallsyms]") kern += p
      else if (comm in ours) user += p
      else other += p }
    END { printf "samples: %.1f%% the run in user space, %.1f%% the run in the kernel, %.1f%% idle, %.1f%% other\n", user, kern, idle, other }'
perf report -i "$data" --stdio --no-children --comms "$comms" --sort dso,sym 2>/dev/null \
  | grep -E '^ *[0-9.]+%' | sort -rn | head -n "${TOP:-15}"
