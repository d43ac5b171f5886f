#!/usr/bin/env bash
# CI test of fabric_check (docs/fabric_check.md) on an emulated fabric of
# its own: 4 hosts (2, 1, 2 and 1 ranks), 2 rails, 2 leaves, RATE Mbit/s
# links (default 200), launched with ncclrun -H ... --rsh "ip netns exec".
#   (a) host FAULT_HOST's link on rail FAULT_RAIL shaped to RATE/4 both
#       ways (its htb class in the host and at its switch port): the only
#       outlier is that host's NIC on that rail, both ways; exit status 1.
#   (b) 5% of the packets host LOSS_HOST receives and sends dropped by
#       nftables in its namespace: the only outlier is that host; exit 1.
#   (c) no fault: RUNS runs (default 5), every one without an outlier, exit 0.
# Every run writes JSON, and the outliers are compared exactly with jq.
#   FCHECK_FLAGS="..."   fabric_check's flags (default: best of 3 passes of 8 x 1 MiB per link
#                        direction, so that one queue overflow on a sound link, about
#                        175 segments, stays under 1% of what a link sends (with 4 x 1 MiB
#                        it read 2.02% once) while the lossy host's links read 3-7%;
#                        an 8 MiB all-reduce, an outlier below 0.2 of its bound: the
#                        ranks share this machine's CPUs, which a busy CI host lends
#                        them unevenly)
#   FABRIC_BIN_DIR=dir   ncclrun and fabric_check (default
#                        ${CARGO_TARGET_DIR:-target}/release)
#   FAB_PREFIX, FAB_SWNS, FAB_RUN_DIR  the fabric's names (default fck-h,
#                        fck-sw, /run/fckfab: beside the fab-* fabric)
#   FABRIC_KEEP=1        leave the fabric up afterwards
# Needs root. Exits non-zero if any check fails; tears the fabric down.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/scripts/env.sh"
[ "$(id -u)" = 0 ] || { echo "fabric check-test: needs root" >&2; exit 2; }
export FAB_PREFIX=${FAB_PREFIX:-fck-h} FAB_SWNS=${FAB_SWNS:-fck-sw} FAB_RUN_DIR=${FAB_RUN_DIR:-/run/fckfab}
export FAB_ENV=$FAB_RUN_DIR/env TOPO_OUT=$FAB_RUN_DIR/topology.conf
. "$here/common.sh"
BIN=${FABRIC_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/release}
for b in ncclrun fabric_check; do
  [ -x "$BIN/$b" ] || { echo "fabric check-test: no $BIN/$b (cargo build --release -p nccl-perf)" >&2; exit 2; }
done
ensure_packages jq:jq nft:nftables
export HOSTS=4 RAILS=2 HOSTS_PER_LEAF=2 RATE=${RATE:-200}
RUNS=${RUNS:-5}
FAULT_HOST=${FAULT_HOST:-2} FAULT_RAIL=${FAULT_RAIL:-1} LOSS_HOST=${LOSS_HOST:-1}
FCHECK_FLAGS=${FCHECK_FLAGS:--b 1M -n 8 --reps 3 --ar-size 8M --ar-fraction 0.2 --timeout 30}
WORK=$(mktemp -d /tmp/nccl-fcheck.XXXXXX)
cleanup() { [ "${FABRIC_KEEP:-0}" = 1 ] || bash "$here/down.sh" >/dev/null 2>&1; }
trap cleanup EXIT
trap 'echo "fabric check-test: interrupted" >&2; exit 130' INT TERM

bash "$here/up.sh" >/dev/null 2>"$WORK/up.log" || { cat "$WORK/up.log"; exit 2; }
. "$FAB_ENV"
hosts="$(fab_ns 0):2,$(fab_ns 1):1,$(fab_ns 2):2,$(fab_ns 3):1"
echo "== fabric_check: $HOSTS hosts (2+1+2+1 ranks), $RAILS rails, 2 leaves, ${RATE} Mbit/s links"

# run NAME: one fabric_check run; its exit status in $rc, JSON in $WORK/NAME.json.
run() {
  local name=$1 start
  start=$(date +%s)
  # shellcheck disable=SC2086  # FCHECK_FLAGS is a list of flags
  timeout -k 10 150 "$BIN/ncclrun" -H "$hosts" --rsh "ip netns exec" --master-addr "$FAB_MASTER_ADDR" \
    --timeout 140 -x NCCL_SOCKET_IFNAME="$FAB_IFNAME" -x NCCL_RS_TOPO_FILE="$FAB_TOPO" \
    -x NCCL_RS_BOOTSTRAP_TIMEOUT=30 -x NCCL_RS_TIMEOUT=60 \
    "$BIN/fabric_check" $FCHECK_FLAGS --json "$WORK/$name.json" >"$WORK/$name.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
}
# The outliers of a run as "kind host rail dir" lines (what is absent left out).
named() { jq -r '.outliers[] | [.kind, .host, .rail, .dir] | map(select(. != null) | tostring) | join(" ")' "$WORK/$1.json" 2>/dev/null; }
FAILED=0
# check NAME WANT_RC WANT_OUTLIERS [FIELDS]: FIELDS (default 4) of each outlier line compared.
check() {
  local name=$1 want_rc=$2 want=$3 fields=${4:-4} got
  got=$(named "$name" | cut -d' ' -f"1-$fields")
  if [ "$rc" = "$want_rc" ] && [ "$got" = "$want" ] && [ -s "$WORK/$name.json" ]; then
    echo "ok   $name (${took} s): exit $rc, outliers: ${got:-none}"
  else
    echo "FAIL $name (${took} s): exit $rc (want $want_rc), outliers: [${got//$'\n'/; }] (want [${want//$'\n'/; }])"
    cat "$WORK/$name.log"
    FAILED=1
  fi
}
# shape H R KBIT: host H's link on rail R at KBIT kbit/s both ways (the
# htb class up.sh made, at the switch port and in the host).
shape() {
  local cls="parent 1: classid 1:10 htb rate ${3}kbit ceil ${3}kbit burst 65536 cburst 65536 quantum 65536"
  # shellcheck disable=SC2086
  tc -n "$FAB_SWNS" class change dev "$(fab_port "$1" "$2")" $cls &&
  # shellcheck disable=SC2086
  tc -n "$(fab_ns "$1")" class change dev "$(fab_if "$2")" $cls
}

# (a) one host's NIC on one rail at a quarter of the rate.
shape "$FAULT_HOST" "$FAULT_RAIL" $((RATE * 1000 / 4)) || { echo "fabric check-test: cannot shape" >&2; exit 2; }
run slow-link
check slow-link 1 "host_rail $(fab_ns "$FAULT_HOST") $FAULT_RAIL both"
shape "$FAULT_HOST" "$FAULT_RAIL" $((RATE * 1000)) || exit 2

# (b) one host loses 5% of its packets, in and out.
ip netns exec "$(fab_ns "$LOSS_HOST")" nft -f - <<'NFT' || { echo "fabric check-test: nft failed" >&2; exit 2; }
table inet fcheck_loss {
  chain in { type filter hook input priority 0; policy accept; numgen random mod 100 < 5 drop; }
  chain out { type filter hook output priority 0; policy accept; numgen random mod 100 < 5 drop; }
}
NFT
run lossy-host
# Which ways the loss shows (in, or both) varies from run to run: host only.
check lossy-host 1 "host $(fab_ns "$LOSS_HOST")" 2
ip netns exec "$(fab_ns "$LOSS_HOST")" nft delete table inet fcheck_loss || exit 2

# (c) no fault.
for i in $(seq 1 "$RUNS"); do
  run "clean-$i"
  check "clean-$i" 0 ""
done
[ "${FABRIC_KEEP:-0}" = 1 ] && echo "fabric check-test: fabric left up ($FAB_ENV)"
[ $FAILED = 0 ] && rm -rf "$WORK" || echo "fabric check-test: logs in $WORK"
exit $FAILED
