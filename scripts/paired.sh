#!/usr/bin/env bash
# Paired A/B runs for a host whose timings drift (vCPUs moved between shared
# and separate caches every few seconds, noisy neighbours): R rounds, each a
# placement probe (copy_floor --pair, ns) and then one short run of every
# configuration back to back, so the configurations of a round share the
# host's state. Prints each round, then per configuration the median time and
# the median of its per-round ratios to the first configuration.
#   CFGS="BIN [VAR=value ...] [-flag value ...];BIN [VAR=value ...];mpi-shm;mpi-tcp" \
#     bash scripts/paired.sh N op size [R]
# BIN is a directory holding ncclrun and the perf tools (e.g. a copy of
# target/release from before a change), then environment settings and
# perf-tool flags of that configuration; mpi-shm / mpi-tcp run Open MPI's
# bench from ../shared/peers (BIN_PEERS, default /tmp/peers). op is a perf
# tool's collective (allreduce allgather reduce_scatter broadcast alltoall
# sendrecv); broadcast reports its in-place time, the rest out of place.
# ITERS=n, ARGS="-R 1" and T (seconds of each peer run) adjust the runs;
# INPLACE=1 reports our in-place times (Open MPI's stay out of place).
# Perf tools that take -P run only the measurement reported.
set -u
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,16p "$0"; exit 2; }
N=$1; op=$2; s=$3; R=${4:-10}; T=${T:-0.15}; PEERS=${BIN_PEERS:-/tmp/peers}
. scripts/perf-tools.sh
tool "$op" > /dev/null  # an unknown op ends here
iters=${ITERS:-}
if [ -z "$iters" ]; then
  iters=20; [ "$s" -le 16777216 ] && iters=30; [ "$s" -le 1048576 ] && iters=300
  [ "$s" -le 65536 ] && iters=2000; [ "$s" -le 1024 ] && iters=5000
fi
warm=$((iters / 10)); [ $warm -lt 10 ] && warm=10
col=6; places=out; [ "$op" = broadcast ] || [ -n "${INPLACE:-}" ] && { col=10; places=in; }
IFS=";" read -ra CF <<< "${CFGS:?set CFGS}"
# Older builds (a BIN from before -P) run both measurements: asked once per
# configuration.
only=()
for cfg in "${CF[@]}"; do
  set -- $cfg
  case $1 in mpi-shm|mpi-tcp) only+=("");; *) only+=("$("$1/$(tool "$op")" -h 2>&1 | grep -q -- --places && echo "-P $places")");; esac
done
MPIRUN="mpirun --allow-run-as-root --oversubscribe -np $N"
out=$(mktemp)
for r in $(seq 1 "$R"); do
  line="$(timeout 30 target/release/copy_floor --pair 2>/dev/null || echo 0)"
  for k in "${!CF[@]}"; do
    set -- ${CF[$k]}
    case $1 in
      mpi-shm) t=$(timeout 300 $MPIRUN "$PEERS/mpi_bench" -s "$s" -o "$op" -t "$T" 2>&1 | grep -E '^ +[0-9]' | awk '{print $4}');;
      mpi-tcp) t=$(timeout 300 $MPIRUN --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "$PEERS/mpi_bench" -s "$s" -o "$op" -t "$T" 2>&1 \
                 | grep -E '^ +[0-9]' | awk '{print $4}');;
      *) b=$1; shift
         # Flags (--a=b too) and their values go to the tool, VAR=value to env.
         envs=(); flags=()
         for w in "$@"; do case $w in -*) flags+=("$w");; *=*) envs+=("$w");; *) flags+=("$w");; esac; done
         t=$(timeout 300 env NCCL_SOCKET_IFNAME=lo "${envs[@]}" "$b/ncclrun" -n "$N" "$b/$(tool "$op")" -b "$s" -e "$s" -n "$iters" -w "$warm" -c 0 ${only[$k]} ${ARGS:-} "${flags[@]}" 2>&1 \
             | grep -E '^ +[0-9]' | awk -v c=$col '{print $c}');;
    esac
    line="$line ${t:-nan}"
  done
  echo "$line" | tee -a "$out"
done
python3 - "$out" "$CFGS" <<'PY'
import math, statistics as st, sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1]) if l.strip()]
for k, c in enumerate(sys.argv[2].split(";")):
    v = [r[k + 1] for r in rows if not math.isnan(r[k + 1])]
    rat = [r[1] / r[k + 1] for r in rows if not math.isnan(r[1] * r[k + 1])]
    if v:
        print(f"  {st.median(v):10.2f}  x{st.median(rat):.2f} vs the first   [{c.strip()}]")
PY
rm -f "$out"
