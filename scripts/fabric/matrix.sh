#!/usr/bin/env bash
# The exact multi-process collective matrix on an emulated fabric: HOSTS
# namespaces (default 4) with RANKS ranks each (default 2), RAILS rails
# (default 2) and two leaves, launched with
#   ncclrun -H fab-h0:2,... --rsh "ip netns exec"
# once per variant below (planner's choice, hierarchical, each algorithm, rank-order rings,
# srun-style round-robin placement, one rail). Every rank checks every case
# bit for bit (tests/src/bin/matrix_worker.rs); a seeded sample of the cases
# unless NCCL_RS_FULL_MATRIX=1, seed NCCL_RS_TEST_SEED (default 1).
#   FABRIC_VARIANTS="default ring ..."  which variants to run (default: all)
#   FABRIC_BIN_DIR=dir                   ncclrun and matrix_worker (default
#                                        ${CARGO_TARGET_DIR:-target}/release)
#   FABRIC_KEEP=1                        leave the fabric up afterwards
# Needs root. Exits non-zero if any variant fails; tears the fabric down.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/scripts/env.sh"
[ "$(id -u)" = 0 ] || { echo "fabric matrix: needs root" >&2; exit 2; }
BIN=${FABRIC_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/release}
for b in ncclrun matrix_worker; do
  [ -x "$BIN/$b" ] || { echo "fabric matrix: no $BIN/$b (cargo build --release --workspace)" >&2; exit 2; }
done
export HOSTS=${HOSTS:-4} RAILS=${RAILS:-2} HOSTS_PER_LEAF=${HOSTS_PER_LEAF:-2}
# Correctness, not speed: links fast enough that the large cases stay short.
export RATE=${RATE:-4000}
RANKS=${RANKS:-2}
WORK=$(mktemp -d /tmp/nccl-fabric.XXXXXX)
cleanup() { [ "${FABRIC_KEEP:-0}" = 1 ] || bash "$here/down.sh" >/dev/null 2>&1; }
trap cleanup EXIT
trap 'echo "fabric matrix: interrupted" >&2; exit 130' INT TERM

bash "$here/up.sh" >"$WORK/topology.conf" 2>"$WORK/up.log" || { cat "$WORK/up.log"; exit 2; }
. "${FAB_ENV:-/run/fab/env}"
hosts=$(echo "$FAB_HOSTS" | tr ',' '\n' | sed "s/\$/:$RANKS/" | paste -sd,)
N=$((HOSTS * RANKS))
echo "== fabric: $HOSTS hosts x $RANKS ranks, $RAILS rails, $HOSTS_PER_LEAF hosts per leaf, ${RATE} Mbit/s links"

# variant NAME -> extra ncclrun flags and rank variables
variant() {
  case $1 in
    default) echo "";;
    ring) echo "-x NCCL_ALGO=ring";;
    tree) echo "-x NCCL_ALGO=allreduce:tree";;
    hd) echo "-x NCCL_ALGO=allreduce:hd";;
    hier) echo "-x NCCL_ALGO=hier";;
    rank-order) echo "-x NCCL_ALGO=ring -x NCCL_RS_RING_ORDER=rank";;
    round-robin) echo "--map-by node";;
    one-rail) echo "-x NCCL_SOCKET_IFNAME==rail0";;
    *) return 1;;
  esac
}
FAILED=0
for v in ${FABRIC_VARIANTS:-default hier ring tree hd rank-order round-robin one-rail}; do
  extra=$(variant "$v") || { echo "fabric matrix: unknown variant $v" >&2; exit 2; }
  start=$(date +%s)
  # shellcheck disable=SC2086  # $extra is a list of flags
  timeout -k 10 900 "$BIN/ncclrun" -H "$hosts" --rsh "ip netns exec" --master-addr "$FAB_MASTER_ADDR" \
    --timeout 840 --tag-output \
    -x NCCL_SOCKET_IFNAME="$FAB_IFNAME" -x NCCL_RS_TOPO_FILE="$FAB_TOPO" \
    -x NCCL_RS_TEST_SEED="${NCCL_RS_TEST_SEED:-1}" -x NCCL_RS_FULL_MATRIX="${NCCL_RS_FULL_MATRIX:-0}" \
    -x NCCL_RS_BOOTSTRAP_TIMEOUT=60 -x NCCL_RS_TIMEOUT=120 \
    -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT \
    $extra "$BIN/matrix_worker" >"$WORK/$v.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  summary=$(grep -m1 -o "rank 0 of.*" "$WORK/$v.log")
  topo=$(grep -m1 -o "Topology: .*" "$WORK/$v.log")
  if [ $rc = 0 ] && [ "$(grep -c "cases.*, 0 failed" "$WORK/$v.log")" = "$N" ]; then
    echo "ok   $v (${took} s): $summary; $topo"
  else
    echo "FAIL $v (exit $rc, ${took} s): $summary"
    grep -E "FAIL|ERROR|error|ncclrun" "$WORK/$v.log" | head -20
    FAILED=1
  fi
done
[ $FAILED = 0 ] && rm -rf "$WORK" || echo "fabric matrix: logs in $WORK"
exit $FAILED
