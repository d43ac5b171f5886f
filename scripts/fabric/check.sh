#!/usr/bin/env bash
# Validates a running fabric (scripts/fabric/up.sh; reads its env file) and
# exits non-zero when a check fails:
#   reach     every host pings every other host on every rail (above
#             CHECK_FULL_MESH hosts: the next host, the first host under the
#             next leaf and host 0, which keeps the ping count linear)
#   isolate   rail R of host A gets no answer from rail R' != R of host B
#             (ping bound to railR, so the ARP request goes out on rail R's
#             L2 network; hosts answer ARP only on the asked rail)
#   shape     every link end (railR in the hosts, its port and both uplink
#             ends in fab-sw) has its htb class at the fabric's rate
#   rate a    one iperf3 flow between host 0 and host 1 on rail 0 gets the
#             expected rate: RATE (the uplink's, if lower, when they sit
#             under different leaves)
#   rate b    (two leaves or more) one flow from each host of leaf 0 to a
#             host of leaf 1 at once on rail 0: each gets its share of the
#             uplink, min(RATE, uplink/flows) (RATE/OVERSUB when full)
#   rate c    full load: every host sends to the next one (ring) on every rail
#             at once; each flow gets min(RATE, uplink)
#   cpu       during rate c, the kernel's packet path (system, irq and
#             softirq time in /proc/stat) leaves at least CHECK_MIN_SPARE %
#             of the CPUs; idle % is reported too (other work on the machine
#             eats idle time, not the fabric's)
# A rate passes when goodput/expected is within 1 +- CHECK_TOL (TCP goodput
# is about 0.955 of the line rate: 1448 payload bytes per 1514-byte frame).
#
#   FAB_ENV=/run/fab/env   the env file up.sh wrote
#   CHECK_RATES=1          0: only reach and isolate
#   CHECK_SECS=5           measured seconds per iperf3 flow (after 1 s omitted)
#   CHECK_TOL=0.15         tolerance of a rate ratio
#   CHECK_MIN_SPARE=25     least CPU % the packet path leaves under full load
#   CHECK_PORT=5301        first iperf3 port (one per flow)
#   CHECK_FULL_MESH=16     most hosts for which reach pings every pair
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/scripts/env.sh"
. "$here/common.sh"

CHECK_RATES=${CHECK_RATES:-1}
CHECK_SECS=${CHECK_SECS:-5}
CHECK_TOL=${CHECK_TOL:-0.15}
CHECK_MIN_SPARE=${CHECK_MIN_SPARE:-25}
CHECK_PORT=${CHECK_PORT:-5301}
CHECK_FULL_MESH=${CHECK_FULL_MESH:-16}

die() { echo "fabric check: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
[ -r "$FAB_ENV" ] || die "no env file $FAB_ENV: run scripts/fabric/up.sh first"
. "$FAB_ENV"
ensure_packages ping:iputils-ping iperf3:iperf3 jq:jq ss:iproute2 timeout:coreutils >&2
N=$FAB_NHOSTS; R=$FAB_RAILS; HPL=$FAB_HOSTS_PER_LEAF
for h in $(seq 0 $((N - 1))); do
  ip netns list | awk '{print $1}' | grep -qx "$(fab_ns "$h")" || die "namespace $(fab_ns "$h") missing"
done

work=$(mktemp -d)
# On exit (or a signal) stop this script's own children: the run_flows
# subshell in flight stops its iperf3s in turn.
cleanup() {
  pkill -TERM -P $$ 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fails=0
finish() {
  if [ $fails = 0 ]; then echo "fabric check: all passed"; exit 0; fi
  echo "fabric check: $fails failed"
  exit 1
}
report() { # status name detail
  printf '%-4s %-10s %s\n' "$1" "$2" "$3"
  [ "$1" = ok ] || fails=$((fails + 1))
}

# The hosts host A pings: all, or (large fabrics) a sample that still
# crosses every leaf uplink.
peers_of() { # a
  if [ "$N" -le "$CHECK_FULL_MESH" ]; then seq 0 $((N - 1))
  else printf '%s\n' $((($1 + 1) % N)) $(((($1 / HPL + 1) * HPL) % N)) 0 | sort -un; fi
}

# reach: one background job per source host, each pinging its peers on every
# rail (3 tries of 1 s each).
for a in $(seq 0 $((N - 1))); do
  (
    for b in $(peers_of "$a"); do
      [ "$a" = "$b" ] && continue
      for r in $(seq 0 $((R - 1))); do
        ok=0
        for _ in 1 2 3; do
          ip netns exec "$(fab_ns "$a")" ping -c1 -W1 -q -I "$(fab_if "$r")" "$(fab_ip "$b" "$r")" >/dev/null 2>&1 && { ok=1; break; }
        done
        [ $ok = 1 ] || echo "$(fab_ns "$a") rail$r -> $(fab_ip "$b" "$r")"
      done
    done
  ) >"$work/reach.$a" &
done
wait
bad=$(cat "$work"/reach.* | head -5)
if [ -z "$bad" ]; then report ok reach "$N hosts x $R rails, $([ "$N" -le "$CHECK_FULL_MESH" ] && echo every pair || echo sampled pairs)"
else report FAIL reach "no answer: $(echo "$bad" | paste -sd';')"; fi

# isolate: the hosts' ARP policy is what makes a foreign rail silent; check
# it first, then ping across rails. Peers: every other host when there are
# at most 8 (on every other rail), else those of peers_of (on the next rail).
for h in $(seq 0 $((N - 1))); do
  v=$(ip netns exec "$(fab_ns "$h")" sysctl -n net.ipv4.conf.all.arp_ignore 2>/dev/null)
  [ "$v" = 1 ] || { report FAIL isolate "$(fab_ns "$h") has arp_ignore=$v, want 1"; break; }
done
if [ "$R" -lt 2 ]; then
  report ok isolate "one rail: nothing to isolate"
else
  for a in $(seq 0 $((N - 1))); do
    if [ "$N" -le 8 ]; then peers=$(seq 0 $((N - 1))); else peers=$(peers_of "$a"); fi
    for r in $(seq 0 $((R - 1))); do
      (
        for b in $peers; do
          [ "$a" = "$b" ] && continue
          if [ "$N" -le 8 ]; then others=$(seq 0 $((R - 1))); else others=$(((r + 1) % R)); fi
          for r2 in $others; do
            [ "$r" = "$r2" ] && continue
            if ip netns exec "$(fab_ns "$a")" ping -c1 -W1 -q -I "$(fab_if "$r")" "$(fab_ip "$b" "$r2")" >/dev/null 2>&1; then
              echo "$(fab_ns "$a") rail$r reached $(fab_ip "$b" "$r2")"
            fi
          done
        done
      ) >"$work/iso.$a.$r" &
    done
  done
  wait
  bad=$(cat "$work"/iso.* | head -5)
  if [ -z "$bad" ]; then report ok isolate "no rail answers on another"
  else report FAIL isolate "$(echo "$bad" | paste -sd';')"; fi
fi

# shape: the htb class rate of each link end, in kbit/s, within 1% of what
# up.sh asked (tc rounds rates to its internal units).
class_kbit() { # ns dev
  tc -n "$1" class show dev "$2" 2>/dev/null | awk '$1 == "class" && $2 == "htb" {
    for (i = 1; i < NF; i++) if ($i == "rate") { v = $(i + 1); break }
    m = 0.001
    if (v ~ /Kbit$/) m = 1; else if (v ~ /Mbit$/) m = 1000; else if (v ~ /Gbit$/) m = 1000000
    sub(/[KMG]?bit$/, "", v); printf "%d\n", v * m + 0.5; exit }'
}
bad=
expect_rate() { # ns dev kbit
  local got
  got=$(class_kbit "$1" "$2")
  if [ -z "$got" ] || ! awk -v g="$got" -v w="$3" 'BEGIN{exit !(g >= w * 0.99 && g <= w * 1.01)}'; then
    bad="$bad $1/$2=${got:-none}kbit(want $3)"
  fi
}
for r in $(seq 0 $((R - 1))); do
  for h in $(seq 0 $((N - 1))); do
    expect_rate "$(fab_ns "$h")" "$(fab_if "$r")" $((FAB_RATE * 1000))
    expect_rate "$FAB_SWNS" "$(fab_port "$h" "$r")" $((FAB_RATE * 1000))
  done
  if [ "$FAB_LEAVES" -gt 1 ]; then
    for l in $(seq 0 $((FAB_LEAVES - 1))); do
      expect_rate "$FAB_SWNS" "$(fab_up "$l" "$r")" "$FAB_UPLINK_KBIT"
      expect_rate "$FAB_SWNS" "$(fab_dn "$l" "$r")" "$FAB_UPLINK_KBIT"
    done
  fi
done
ends="$((N * R * 2)) host-link ends at $FAB_RATE Mbit/s"
[ "$FAB_LEAVES" -le 1 ] || ends="$ends, $((FAB_LEAVES * R * 2)) uplink ends at $(awk -v k="$FAB_UPLINK_KBIT" 'BEGIN{print k/1000}') Mbit/s"
if [ -z "$bad" ]; then report ok shape "$ends"
else report FAIL shape "$(echo "$bad" | cut -c2-300)"; fi

[ "$CHECK_RATES" = 1 ] || finish
[ "$N" -ge 2 ] || { report ok rate "one host: no flows"; finish; }

UP_MBIT=$(awk -v k="$FAB_UPLINK_KBIT" 'BEGIN{print k/1000}')
leaf_of() { echo $(($1 / HPL)); }
minf() { awk -v a="$1" -v b="$2" 'BEGIN{print (a < b) ? a : b}'; }
# /proc/stat's cpu line as "total idle kernel": idle counts iowait, kernel
# counts system, irq and softirq (where veths, bridges and qdiscs run).
cpu_sample() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6, $4+$7+$8}' /proc/stat; }

# Runs the flows "src dst rail expected_mbit" (one per line) at once; prints
# one line per flow "src dst rail mbit ratio" and writes the CPU "idle%
# kernel%" measured while they all ran to $work/cpu. Every process has a deadline.
run_flows() {
  local flows=$1 i=0 port src dst r exp
  local deadline=$((CHECK_SECS + 20))
  local spids=() cpids=()
  # Called as $(run_flows ...): a subshell, whose exit (normal or by a
  # signal) stops whatever it started.
  trap 'kill "${spids[@]}" "${cpids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
  rm -f "$work"/flow.*
  while read -r src dst r exp; do
    port=$((CHECK_PORT + i))
    timeout "$deadline" ip netns exec "$(fab_ns "$dst")" iperf3 -s -1 -B "$(fab_ip "$dst" "$r")" -p "$port" >/dev/null 2>&1 &
    spids+=($!)
    i=$((i + 1))
  done <<<"$flows"
  # Servers listening (deadline 5 s).
  i=0
  while read -r src dst r exp; do
    port=$((CHECK_PORT + i))
    for _ in $(seq 1 50); do
      ip netns exec "$(fab_ns "$dst")" ss -Hltn "sport = :$port" | grep -q . && break
      sleep 0.1
    done
    i=$((i + 1))
  done <<<"$flows"
  i=0
  while read -r src dst r exp; do
    port=$((CHECK_PORT + i))
    timeout "$deadline" ip netns exec "$(fab_ns "$src")" iperf3 -c "$(fab_ip "$dst" "$r")" -B "$(fab_ip "$src" "$r")" \
      -p "$port" -t "$CHECK_SECS" -O 1 -J >"$work/flow.$i" 2>&1 &
    cpids+=($!)
    i=$((i + 1))
  done <<<"$flows"
  # CPU idle over the measured seconds, away from the flows' start and end.
  sleep 1.5
  local s0 s1
  s0=$(cpu_sample)
  sleep "$((CHECK_SECS - 1))"
  s1=$(cpu_sample)
  awk -v a="$s0" -v b="$s1" 'BEGIN{split(a,x," "); split(b,y," "); t=y[1]-x[1]; if (t <= 0) t = 1; printf "%.0f %.0f\n", 100*(y[2]-x[2])/t, 100*(y[3]-x[3])/t}' >"$work/cpu"
  for p in "${cpids[@]}"; do wait "$p" 2>/dev/null; done
  i=0
  while read -r src dst r exp; do
    local bps
    bps=$(jq -r '.end.sum_received.bits_per_second // 0' "$work/flow.$i" 2>/dev/null || echo 0)
    awk -v s="$src" -v d="$dst" -v r="$r" -v b="$bps" -v e="$exp" \
      'BEGIN{printf "%s %s %s %.1f %.3f\n", s, d, r, b/1e6, b/1e6/e}'
    i=$((i + 1))
  done <<<"$flows"
}

# Reports one rate check from run_flows' lines.
judge() { # name lines extra
  local name=$1 lines=$2 extra=${3:-} bad detail
  bad=$(echo "$lines" | awk -v t="$CHECK_TOL" '$5 < 1 - t || $5 > 1 + t' | wc -l)
  detail=$(echo "$lines" | awk '{sep = (NR > 1) ? ", " : ""; printf "%sh%s->h%s/rail%s %.0f Mbit/s (%.3f)", sep, $1, $2, $3, $4, $5}')
  if [ "$bad" = 0 ]; then report ok "$name" "$detail$extra"; else report FAIL "$name" "$detail$extra"; fi
}

# rate a
exp=$FAB_RATE
[ "$(leaf_of 0)" = "$(leaf_of 1)" ] || exp=$(minf "$FAB_RATE" "$UP_MBIT")
judge "rate a" "$(run_flows "0 1 0 $exp")" " vs $exp Mbit/s"

# rate b
if [ "$FAB_LEAVES" -ge 2 ]; then
  k=$HPL; [ $((2 * HPL)) -le "$N" ] || k=$((N - HPL))
  exp=$(minf "$FAB_RATE" "$(awk -v u="$UP_MBIT" -v k="$k" 'BEGIN{print u/k}')")
  flows=$(for i in $(seq 0 $((k - 1))); do echo "$i $((HPL + i)) 0 $exp"; done)
  lines=$(run_flows "$flows")
  sum=$(echo "$lines" | awk '{s += $4} END{printf "%.0f", s}')
  judge "rate b" "$lines" " vs $exp Mbit/s each; sum $sum Mbit/s over a $UP_MBIT Mbit/s uplink"
else
  report ok "rate b" "one leaf: no spine"
fi

# rate c
exp=$FAB_RATE
[ "$FAB_LEAVES" -lt 2 ] || exp=$(minf "$FAB_RATE" "$UP_MBIT")
flows=$(for r in $(seq 0 $((R - 1))); do for h in $(seq 0 $((N - 1))); do echo "$h $(((h + 1) % N)) $r $exp"; done; done)
lines=$(run_flows "$flows")
sum=$(echo "$lines" | awk '{s += $4} END{printf "%.0f", s}')
judge "rate c" "$lines" " vs $exp Mbit/s each; sum $sum Mbit/s"
read -r idle kern <"$work/cpu" || { idle=0; kern=100; }
# Other work on the machine eats idle time but not the fabric's: the check
# is on what the kernel's packet path leaves over, 100 - kernel%.
cpu="idle ${idle}%, kernel ${kern}% under full load (want kernel <= $((100 - CHECK_MIN_SPARE))%)"
if [ $((100 - kern)) -ge "$CHECK_MIN_SPARE" ]; then report ok cpu "$cpu"
else report FAIL cpu "$cpu: the CPUs, not the links, may limit the rates"; fi

finish
