#!/usr/bin/env bash
# The fabric benchmark table: all-reduce, all-gather, reduce-scatter and
# all-to-all at 64 KiB, 1 MiB, 16 MiB and 64 MiB on an emulated fabric
# (scripts/fabric/up.sh; defaults: 4 hosts x 2 ranks, 2 rails, 2 leaves,
# 500 Mbit/s links, 2:1 oversubscribed uplinks, ranks placed round-robin
# over the hosts as srun's cyclic distribution does). Columns, times in ms
# (median of REPS runs):
#   flat      the ring in rank order (NCCL_ALGO=ring NCCL_RS_RING_ORDER=rank)
#   topo      the planner's choice over the fabric (algorithm in brackets)
#   hier      the hierarchical schedules (NCCL_ALGO=hier)
#   1 rail    the same over rail 0 only
#   pred      the planner's predicted time for topo
#   bound     what the links allow: the bytes the busiest host link or leaf
#             uplink must carry at the shaped rate
#   ompi      Open MPI (mpirun over the same namespaces, TCP between hosts)
#   gloo      PyTorch's Gloo (ncclrun starting gloo_rank.py)
# Environment: HOSTS RANKS RAILS HOSTS_PER_LEAF RATE OVERSUB MAP (node|slot)
# REPS (3) OPS SIZES PEERS (dir with mpi_bench and venv/, default /tmp/peers;
# set PEERS= to skip the peers). Needs root and a release build.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${FABRIC_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/release}
export HOSTS=${HOSTS:-4} RAILS=${RAILS:-2} HOSTS_PER_LEAF=${HOSTS_PER_LEAF:-2} RATE=${RATE:-500} OVERSUB=${OVERSUB:-2}
RANKS=${RANKS:-2}; MAP=${MAP:-node}; REPS=${REPS:-3}
OPS=${OPS:-allreduce allgather reduce_scatter alltoall}
SIZES=${SIZES:-65536 1048576 16777216 67108864}
PEERS=${PEERS-/tmp/peers}
. "$repo/scripts/perf-tools.sh"
bash "$here/up.sh" >/dev/null 2>&1 || { echo "bench: fabric up failed" >&2; exit 2; }
trap 'bash "$here/down.sh" >/dev/null 2>&1' EXIT
. /run/fab/env
hosts=$(echo "$FAB_HOSTS" | tr ',' '\n' | sed "s/\$/:$RANKS/" | paste -sd,)
addrs=$(for h in $(seq 0 $((HOSTS - 1))); do echo "10.90.0.$((h + 1)):$RANKS"; done | paste -sd,)
N=$((HOSTS * RANKS))
L=$RANKS
WORK=$(mktemp -d /tmp/nccl-fabbench.XXXXXX)

iters() { local s=$1; if [ "$s" -ge 16777216 ]; then echo 3; elif [ "$s" -ge 1048576 ]; then echo 10; else echo 50; fi; }
median() { sort -g | awk '{v[NR]=$1} END {if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)]}'; }

# ours OP SIZE [ncclrun flags...]: one run's out-of-place time (us); the
# INFO line of the chosen algorithm goes to $WORK/last.log.
ours() {
  local op=$1 s=$2; shift 2
  local it; it=$(iters "$s")
  timeout -k 5 300 "$BIN/ncclrun" -H "$hosts" --map-by "$MAP" --rsh "ip netns exec" --master-addr "$FAB_MASTER_ADDR" \
    -x NCCL_SOCKET_IFNAME="$FAB_IFNAME" -x NCCL_RS_TOPO_FILE="$FAB_TOPO" -x NCCL_RS_TOPO_OVERSUB="$OVERSUB" \
    -x NCCL_DEBUG=INFO "$@" "$BIN/$(tool "$op")" -b "$s" -e "$s" -n "$it" -w 1 -c 0 -P out >"$WORK/last.log" 2>&1
  grep -E '^ +[0-9]' "$WORK/last.log" | awk '{print $6}'
}
ompi() {
  local op=$1 s=$2
  ip netns exec fab-h0 unshare --uts sh -c 'hostname fab-h0; TMPDIR=/run/fab/tmp/fab-h0; mkdir -p $TMPDIR; export TMPDIR; exec "$@"' sh \
    timeout -k 5 300 mpirun --allow-run-as-root -H "$addrs" -np "$N" --map-by "$MAP" --mca plm_rsh_agent "$here/nsexec" \
    --mca btl tcp,self,vader --mca btl_tcp_if_include "$(seq -s, -f 'rail%g' 0 $((RAILS - 1)))" --mca oob_tcp_if_include rail0 \
    "$PEERS/mpi_bench" -s "$s" -o "$op" -t 2 2>/dev/null | grep -E '^ +[0-9]' | awk '{print $4}'
}
gloo() {
  local op=$1 s=$2
  timeout -k 5 300 "$BIN/ncclrun" -H "$hosts" --map-by "$MAP" --rsh "ip netns exec" --master-addr "$FAB_MASTER_ADDR" \
    -x GLOO_SOCKET_IFNAME=rail0 "$PEERS/venv/bin/python" "$here/gloo_rank.py" -o "$op" -s "$s" -i "$(iters "$s")" 2>/dev/null \
    | awk '{print $3}'
}
# The link-rate bound (ms) of OP at SIZE (nccl-tests' size meaning).
bound() {
  awk -v op="$1" -v s="$2" -v n=$N -v l=$L -v h=$HOSTS -v r=$RAILS -v rate=$RATE -v o=$OVERSUB -v hpl=$HOSTS_PER_LEAF 'BEGIN {
    bw = r * rate * 1e6 / 8; up = bw * hpl / o; leaves = int((h + hpl - 1) / hpl)
    if (op == "allreduce") { host = 2 * (h - 1) / h * s; upl = (leaves > 1) ? host : 0 }
    else if (op == "alltoall") { host = l * (n - l) / n * s; upl = (leaves > 1) ? hpl * l * s * (n - hpl * l) / n : 0 }
    else { host = (h - 1) / h * s; upl = (leaves > 1) ? host : 0 }
    t = host / bw; if (upl / up > t) t = upl / up
    printf "%.1f", t * 1e3 }'
}
ms() { awk -v u="$1" 'BEGIN { if (u == "" || u == "nan") print "—"; else printf "%.1f", u / 1e3 }'; }

echo "# fabric: $HOSTS hosts x $RANKS ranks (--map-by $MAP), $RAILS rails, $HOSTS_PER_LEAF hosts per leaf, $RATE Mbit/s links, uplinks $OVERSUB:1; median of $REPS; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| op | size | flat ring | topo | hier | 1 rail | pred | bound | topo/flat | bound/topo | 2 rails/1 | ompi | gloo |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for op in $OPS; do
  for s in $SIZES; do
    f=(); t=(); hi=(); o=(); om=(); gl=()
    for _ in $(seq 1 "$REPS"); do
      f+=("$(ours "$op" "$s" -x NCCL_ALGO=ring -x NCCL_RS_RING_ORDER=rank)")
      t+=("$(ours "$op" "$s")")
      info=$(grep -o "algorithm [A-Za-z]*.*for $s B" "$WORK/last.log" | head -1)
      hi+=("$(ours "$op" "$s" -x NCCL_ALGO=hier)")
      o+=("$(ours "$op" "$s" -x NCCL_SOCKET_IFNAME==rail0)")
      if [ -n "$PEERS" ]; then om+=("$(ompi "$op" "$s")"); gl+=("$(gloo "$op" "$s")"); fi
    done
    fm=$(printf '%s\n' "${f[@]}" | median); tm=$(printf '%s\n' "${t[@]}" | median); him=$(printf '%s\n' "${hi[@]}" | median); onem=$(printf '%s\n' "${o[@]}" | median)
    omm=$(printf '%s\n' "${om[@]:-}" | median); glm=$(printf '%s\n' "${gl[@]:-}" | median)
    algo=$(echo "$info" | awk '{print $2}' | tr -d ,); pred=$(echo "$info" | grep -o "predicted [0-9.]*" | awk '{print $2}')
    b=$(bound "$op" "$s")
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "—" }'; }
    echo "| $op | $s | $(ms "$fm") | $(ms "$tm") ($algo) | $(ms "$him") | $(ms "$onem") | $(ms "$pred") | $b | $(ratio "$fm" "$tm") | $(ratio "$(awk -v b="$b" 'BEGIN{print b*1e3}')" "$tm") | $(ratio "$onem" "$tm") | $(ms "$omm") | $(ms "$glm") |"
  done
done
rm -rf "$WORK"
