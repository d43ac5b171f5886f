#!/usr/bin/env bash
# fabric_sim against the emulated fabric (docs/simulation.md).
#
# For each configuration (rails, oversubscription, placement) it brings up
# the emulated fabric under its own names (namespaces sim-h*, sim-sw, run
# dir /run/simfab; beside the lead's fab-*), runs all-reduce, all-gather and
# reduce-scatter at each size through ncclrun, and asks fabric_sim for the
# same call on the same fabric (two-tier, rail planes, 500 Mbit/s NICs,
# uplinks RATE*HOSTS_PER_LEAF/OVERSUB per rail).
#
#   sim-validate.sh measure   runs the measurements, appends to $DATA
#                             (RATE: the links' Mbit/s, 500)
#   sim-validate.sh report    prints the markdown tables of $DATA with the
#                             simulator's predictions and the errors
#   sim-validate.sh perfdoc   prints docs/performance.md's fabric table as
#                             data lines (DATA=file report reads them)
#   sim-validate.sh           measure, then report
#
# Environment: CONFIGS ("RAILS:OVERSUB:MAP ...", MAP slot|node), OPS, SIZES,
# ALGOS (topo: the planner's choice over the fabric; flat: NCCL_ALGO=ring
# NCCL_RS_RING_ORDER=rank; any other word: that NCCL_ALGO), DATA (/tmp/sim-validate.tsv), SIM_FLAGS (extra
# fabric_sim flags: the calibrated costs, see docs/simulation.md). Needs root
# and a release build (ncclrun, the perf tools, fabric_sim).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${FABRIC_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/release}
export FAB_PREFIX=sim-h FAB_SWNS=sim-sw FAB_RUN_DIR=/run/simfab
export HOSTS=4 HOSTS_PER_LEAF=2 RATE=${RATE:-500}
RANKS=2
CONFIGS=${CONFIGS:-"1:1:slot 1:2:node 2:1:node 2:2:slot 1:1:node 1:2:slot 2:1:slot 2:2:node"}
OPS=${OPS:-allreduce allgather reduce_scatter}
SIZES=${SIZES:-1048576 16777216 67108864}
ALGOS=${ALGOS:-topo flat}
DATA=${DATA:-/tmp/sim-validate.tsv}
# TCP's payload per 1500-byte frame on the wire (1448 of 1514 bytes).
SIM_FLAGS=${SIM_FLAGS:---goodput 0.956 --alpha-us 113 --link-latency-us 0 --intra-gbps 42.4}
. "$repo/scripts/perf-tools.sh"

iters() { if [ "$1" -ge 67108864 ]; then echo 2; elif [ "$1" -ge 16777216 ]; then echo 3; else echo 10; fi; }

measure() {
  work=$(mktemp -d /tmp/sim-validate.XXXXXX)
  trap 'bash "$here/down.sh" >/dev/null 2>&1; rm -rf "$work"' EXIT
  for cfg in $CONFIGS; do
    IFS=: read -r rails over map <<<"$cfg"
    RAILS=$rails OVERSUB=$over bash "$here/up.sh" >/dev/null 2>&1 || { echo "sim-validate: fabric up failed ($cfg)" >&2; exit 2; }
    . "$FAB_RUN_DIR/env"
    local hosts; hosts=$(echo "$FAB_HOSTS" | tr ',' '\n' | sed "s/\$/:$RANKS/" | paste -sd,)
    for op in $OPS; do
      for s in $SIZES; do
        for algo in $ALGOS; do
          local extra=()
          case $algo in
            topo) ;;
            flat) extra=(-x NCCL_ALGO=ring -x NCCL_RS_RING_ORDER=rank) ;;
            *) extra=(-x NCCL_ALGO="$algo") ;;
          esac
          timeout -k 5 300 "$BIN/ncclrun" -H "$hosts" --map-by "$map" --rsh "ip netns exec" --master-addr "$FAB_MASTER_ADDR" \
            -x NCCL_SOCKET_IFNAME="$FAB_IFNAME" -x NCCL_RS_TOPO_FILE="$FAB_TOPO" -x NCCL_RS_TOPO_OVERSUB="$over" \
            -x NCCL_DEBUG=INFO "${extra[@]}" "$BIN/$(tool "$op")" -b "$s" -e "$s" -n "$(iters "$s")" -w 1 -c 0 -P out >"$work/last.log" 2>&1
          local us chosen
          us=$(grep -E '^ +[0-9]' "$work/last.log" | awk '{print $6}' | head -1)
          chosen=$(grep -o "algorithm [A-Za-z]*.*for $s B" "$work/last.log" | head -1 | awk '{print $2}' | tr -d ,)
          printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rails" "$over" "$map" "$op" "$s" "$algo" "${us:-nan}" "${chosen:-?}" \
            "$(cut -d' ' -f1 /proc/loadavg)" "$RATE" | tee -a "$DATA"
        done
      done
    done
  done
}

report() {
  [ -x "$BIN/fabric_sim" ] || { echo "sim-validate: no $BIN/fabric_sim (cargo build --release -p fabric-sim)" >&2; exit 2; }
  local errs=() prev=""
  while IFS=$'\t' read -r rails over map op s algo us chosen load rate; do
    rate=${rate:-500}
    # One table per fabric configuration.
    if [ "$rails:$over:$map:$rate" != "$prev" ]; then
      prev=$rails:$over:$map:$rate
      printf '\n#### %s rail(s) at %s Mbit/s, %s:1 uplinks, --map-by %s\n\n' "$rails" "$rate" "$over" "$map"
      printf '| op | size | algo | measured ms | simulated ms | error | algorithm (run / sim) | sim bottleneck | load |\n'
      printf '|---|---|---|---|---|---|---|---|---|\n'
    fi
    local place=block; [ "$map" = node ] && place=cyclic
    local flags=(--algo planner --ring-order topo)
    # NCCL_ALGO=ring: INFO named the ring at the first (1-byte) call already.
    case $algo in
      topo) ;;
      flat) flags=(--algo ring --ring-order rank); [ "$chosen" = "?" ] && chosen=Ring ;;
      *) flags=(--algo "$algo" --ring-order topo) ;;
    esac
    local row
    # shellcheck disable=SC2086
    row=$("$BIN/fabric_sim" --fabric two-tier --rails "$rails" --rails-layout planes --hosts-per-leaf "$HOSTS_PER_LEAF" \
      --spines 1 --oversub "$over" --nic-gbps "$(awk -v r="$rate" 'BEGIN{print r/1000}')" --ranks $((HOSTS * RANKS)) --ranks-per-host "$RANKS" \
      --placement "$place" --op "$op" --sizes "$s" "${flags[@]}" $SIM_FLAGS --csv | tail -1)
    local sim_us sim_algo hot
    sim_us=$(echo "$row" | cut -d, -f7); sim_algo=$(echo "$row" | cut -d, -f6); hot=$(echo "$row" | cut -d, -f11)
    [ -n "$sim_us" ] || { echo "sim-validate: fabric_sim gave no answer for $rails:$over:$map $op $s $algo" >&2; exit 2; }
    local err
    err=$(awk -v m="$us" -v p="$sim_us" 'BEGIN { if (m + 0 > 0) printf "%+.1f%%", (p - m) / m * 100; else print "—" }')
    errs+=("$(awk -v m="$us" -v p="$sim_us" 'BEGIN { if (m + 0 > 0) { e = (p - m) / m * 100; printf "%.3f", e < 0 ? -e : e } }')")
    printf '| %s | %s | %s | %.1f | %.1f | %s | %s / %s | %s | %s |\n' "$op" \
      "$(numfmt --to=iec "$s")" "$algo" "$(awk -v u="$us" 'BEGIN{print u/1e3}')" "$(awk -v u="$sim_us" 'BEGIN{print u/1e3}')" \
      "$err" "$chosen" "$sim_algo" "$hot" "$load"
  done <"$DATA"
  printf '%s\n' "${errs[@]}" | grep . | sort -g | awk '{v[NR]=$1} END {if (NR) printf "\n%d configurations: median |error| %.1f%%, worst %.1f%%\n", NR, (NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2), v[NR]}'
}

# The fabric table of docs/performance.md (4 hosts x 2 ranks --map-by node,
# 2 rails, 2:1; an unloaded machine) as data lines: flat ring, topo and
# 1 rail (the default over rail 0 only: the one-rail fabric).
perfdoc() {
  awk -F'|' '/^\| (allreduce|allgather|reduce_scatter) \| [0-9]/ {
      gsub(/ /, "", $2); gsub(/ /, "", $3); split($5, t, " ")
      if ($3 + 0 < 1048576) next
      printf "2\t2\tnode\t%s\t%s\tflat\t%s\tRing\t—\n", $2, $3, $4 * 1000
      printf "2\t2\tnode\t%s\t%s\ttopo\t%s\t%s\t—\n", $2, $3, t[1] * 1000, substr(t[2], 2, length(t[2]) - 2)
      printf "1\t2\tnode\t%s\t%s\ttopo\t%s\t?\t—\n", $2, $3, $7 * 1000
    }' "$repo/docs/performance.md" | sort -s -k1,3
}

case ${1:-all} in
  perfdoc) perfdoc ;;
  measure) measure ;;
  report) report ;;
  all) measure; report ;;
  *) echo "usage: $0 [measure|report|all]" >&2; exit 2 ;;
esac
