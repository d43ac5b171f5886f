#!/usr/bin/env bash
# Brings up an emulated leaf-spine, multi-rail cluster from network
# namespaces (picture, names and addresses: docs/fabric.md). Idempotent: tears
# down a previous fabric first. Prints a Slurm topology.conf of what it built
# on stdout (progress goes to stderr) and writes it to $TOPO_OUT, plus an env
# file for tests to source. Parameters (environment variables):
#
#   HOSTS=4            hosts fab-h0..fab-h(HOSTS-1), 1..253
#   RAILS=2            rails per host (interfaces rail0..), 1..8; rail R is
#                      the subnet 10.(90+R).0.0/24, host H is .(H+1) on it
#   HOSTS_PER_LEAF=2   hosts under one leaf switch (leaf L holds hosts
#                      L*HOSTS_PER_LEAF ..); one leaf means no spine
#   RATE=500           host-link rate in Mbit/s, each direction
#   OVERSUB=1          leaf uplink oversubscription: an uplink carries
#                      RATE*HOSTS_PER_LEAF/OVERSUB each way (2 means 2:1)
#   NEIGH=static       static: every host gets a permanent neighbour entry
#                      for each peer on each rail (the kernel's ARP table
#                      is shared by all namespaces and its gc_thresh3,
#                      1024 by default, caps the dynamic entries of all of
#                      them: 64 hosts x 8 rails need 32256); arp: resolve
#                      peers with ARP (fine for small fabrics)
#   OFFLOAD=on         on: keep TSO/GSO/GRO on the veths (a fraction of the
#                      CPU; rates as exact); off: turn them off
#   TOPO_OUT=/run/fab/topology.conf   where topology.conf goes
#   FAB_ENV=/run/fab/env              where the env file goes (FAB_HOSTS,
#                      FAB_MASTER_ADDR, FAB_IFNAME, FAB_RAILS, FAB_RATE, ...)
#
# Every switch lives in the namespace fab-sw: per rail, one Linux bridge per
# leaf and one spine bridge; a host's railR is a veth whose peer is a port of
# its leaf bridge of rail R; each leaf bridge reaches its rail's spine bridge
# through a veth pair (the uplink). Rates are htb classes on the egress of
# both ends of every link. Nothing in the root namespace is touched.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/scripts/env.sh"
. "$here/common.sh"

HOSTS=${HOSTS:-4}
RAILS=${RAILS:-2}
HOSTS_PER_LEAF=${HOSTS_PER_LEAF:-2}
RATE=${RATE:-500}
OVERSUB=${OVERSUB:-1}
OFFLOAD=${OFFLOAD:-on}
NEIGH=${NEIGH:-static}
TOPO_OUT=${TOPO_OUT:-$FAB_RUN_DIR/topology.conf}

die() { echo "fabric up: $*" >&2; exit 2; }
log() { echo "fabric up: $*" >&2; }
int_in() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] && [ "$2" -le "$4" ] || die "$1=$2: want an integer in $3..$4"; }

[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
int_in HOSTS "$HOSTS" 1 "$FAB_MAX_HOSTS"
int_in RAILS "$RAILS" 1 "$FAB_MAX_RAILS"
int_in HOSTS_PER_LEAF "$HOSTS_PER_LEAF" 1 "$FAB_MAX_HOSTS"
int_in RATE "$RATE" 1 100000
[[ "$OVERSUB" =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v o="$OVERSUB" 'BEGIN{exit !(o > 0)}' \
  || die "OVERSUB=$OVERSUB: want a positive number (2 means 2:1)"
case "$OFFLOAD" in on|off) ;; *) die "OFFLOAD=$OFFLOAD: want on or off" ;; esac
case "$NEIGH" in static|arp) ;; *) die "NEIGH=$NEIGH: want static or arp" ;; esac
pkgs=(ip:iproute2 tc:iproute2)
[ "$OFFLOAD" = off ] && pkgs+=(ethtool:ethtool)
ensure_packages "${pkgs[@]}" >&2

LEAVES=$(((HOSTS + HOSTS_PER_LEAF - 1) / HOSTS_PER_LEAF))
RATE_KBIT=$((RATE * 1000))
# Uplink rate in kbit/s (tc's kbit is 1000 bit/s), rounded to the nearest.
UP_KBIT=$(awk -v r="$RATE" -v h="$HOSTS_PER_LEAF" -v o="$OVERSUB" 'BEGIN{printf "%d", r*1000*h/o + 0.5}')
[ "$UP_KBIT" -ge 1 ] || die "uplink rate rounds to 0 (RATE*HOSTS_PER_LEAF/OVERSUB)"
leaf_of() { echo $(($1 / HOSTS_PER_LEAF)); }

bash "$here/down.sh"

# The htb class of a link direction: burst covers 1 ms at the rate (at least
# one 64 KiB GSO segment), so the token bucket never starves between timer
# wakeups; the bfifo queue holds 5 ms at the rate (at least 256 KiB), enough
# for TCP to keep the link busy without seconds of bufferbloat.
shape_cmds() { # dev rate_kbit
  local dev=$1 kbit=$2 burst limit
  burst=$((kbit * 1000 / 8 / 1000)); [ "$burst" -ge 65536 ] || burst=65536
  limit=$((kbit * 1000 / 8 * 5 / 1000)); [ "$limit" -ge 262144 ] || limit=262144
  echo "qdisc add dev $dev root handle 1: htb default 10 r2q 1"
  echo "class add dev $dev parent 1: classid 1:10 htb rate ${kbit}kbit ceil ${kbit}kbit burst $burst cburst $burst quantum 65536"
  echo "qdisc add dev $dev parent 1:10 handle 10: bfifo limit $limit"
}

log "$HOSTS hosts x $RAILS rails, $LEAVES leaves of $HOSTS_PER_LEAF, host links ${RATE} Mbit/s, uplinks $((UP_KBIT / 1000)) Mbit/s (oversubscription $OVERSUB:1)"
ip netns add "$FAB_SWNS"
for h in $(seq 0 $((HOSTS - 1))); do ip netns add "$(fab_ns "$h")"; done

# Quiet, predictable namespaces: no IPv6 (no DAD or router solicitations on
# the rails); in hosts, ARP answers only for the address of the asking rail
# (arp_ignore=1, arp_announce=2), as on multi-rail hosts, so a rail never
# answers for another; in fab-sw, bridged frames skip iptables.
sysctl_ns() { local ns=$1; shift; for kv in "$@"; do ip netns exec "$ns" sysctl -qw "$kv" >/dev/null 2>&1 || true; done; }
sysctl_ns "$FAB_SWNS" net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
  net.bridge.bridge-nf-call-iptables=0 net.bridge.bridge-nf-call-ip6tables=0 net.bridge.bridge-nf-call-arptables=0
for h in $(seq 0 $((HOSTS - 1))); do
  sysctl_ns "$(fab_ns "$h")" net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
    net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
    net.ipv4.conf.default.arp_ignore=1 net.ipv4.conf.default.arp_announce=2
done

# Switches, ports and links, created in one batch from fab-sw.
sw=$(mktemp); trap 'rm -f "$sw"' EXIT
{
  echo "link set lo up"
  for r in $(seq 0 $((RAILS - 1))); do
    if [ "$LEAVES" -gt 1 ]; then
      echo "link add $(fab_spine "$r") type bridge stp_state 0 forward_delay 0 mcast_snooping 0"
      echo "link set $(fab_spine "$r") up"
    fi
    for l in $(seq 0 $((LEAVES - 1))); do
      echo "link add $(fab_leaf "$l" "$r") type bridge stp_state 0 forward_delay 0 mcast_snooping 0"
      echo "link set $(fab_leaf "$l" "$r") up"
      if [ "$LEAVES" -gt 1 ]; then
        echo "link add $(fab_up "$l" "$r") type veth peer name $(fab_dn "$l" "$r")"
        echo "link set $(fab_up "$l" "$r") master $(fab_leaf "$l" "$r")"
        echo "link set $(fab_dn "$l" "$r") master $(fab_spine "$r")"
        echo "link set $(fab_up "$l" "$r") up"
        echo "link set $(fab_dn "$l" "$r") up"
      fi
    done
    for h in $(seq 0 $((HOSTS - 1))); do
      echo "link add $(fab_port "$h" "$r") type veth peer name $(fab_if "$r") netns $(fab_ns "$h") address $(fab_mac "$h" "$r")"
      echo "link set $(fab_port "$h" "$r") master $(fab_leaf "$(leaf_of "$h")" "$r")"
      echo "link set $(fab_port "$h" "$r") up"
    done
  done
} >"$sw"
ip -n "$FAB_SWNS" -batch "$sw"

# Hosts: lo and the rails up, one address per rail, and (NEIGH=static) the
# peers' fixed MACs on each rail.
for h in $(seq 0 $((HOSTS - 1))); do
  {
    echo "link set lo up"
    for r in $(seq 0 $((RAILS - 1))); do
      echo "addr add $(fab_ip "$h" "$r")/24 dev $(fab_if "$r")"
      echo "link set $(fab_if "$r") up"
      [ "$NEIGH" != static ] || fab_neigh_cmds "$h" "$r" "$HOSTS"
    done
  } | ip -n "$(fab_ns "$h")" -batch -
done

if [ "$OFFLOAD" = off ]; then
  # Segmentation offloads let a veth carry 64 KiB frames, which htb can only
  # meter a whole frame at a time.
  for r in $(seq 0 $((RAILS - 1))); do
    for h in $(seq 0 $((HOSTS - 1))); do
      ip netns exec "$(fab_ns "$h")" ethtool -K "$(fab_if "$r")" tso off gso off gro off >/dev/null 2>&1
      ip netns exec "$FAB_SWNS" ethtool -K "$(fab_port "$h" "$r")" tso off gso off gro off >/dev/null 2>&1
    done
    if [ "$LEAVES" -gt 1 ]; then
      for l in $(seq 0 $((LEAVES - 1))); do
        ip netns exec "$FAB_SWNS" ethtool -K "$(fab_up "$l" "$r")" tso off gso off gro off >/dev/null 2>&1
        ip netns exec "$FAB_SWNS" ethtool -K "$(fab_dn "$l" "$r")" tso off gso off gro off >/dev/null 2>&1
      done
    fi
  done
fi

# Shaping: both directions of every host link at RATE, of every uplink at
# RATE*HOSTS_PER_LEAF/OVERSUB.
{
  for r in $(seq 0 $((RAILS - 1))); do
    for h in $(seq 0 $((HOSTS - 1))); do shape_cmds "$(fab_port "$h" "$r")" "$RATE_KBIT"; done
    if [ "$LEAVES" -gt 1 ]; then
      for l in $(seq 0 $((LEAVES - 1))); do
        shape_cmds "$(fab_up "$l" "$r")" "$UP_KBIT"
        shape_cmds "$(fab_dn "$l" "$r")" "$UP_KBIT"
      done
    fi
  done
} | tc -n "$FAB_SWNS" -batch -
for h in $(seq 0 $((HOSTS - 1))); do
  for r in $(seq 0 $((RAILS - 1))); do shape_cmds "$(fab_if "$r")" "$RATE_KBIT"; done | tc -n "$(fab_ns "$h")" -batch -
done

# Ready when host 0 reaches every other host on every rail (deadline 5 s each).
for r in $(seq 0 $((RAILS - 1))); do
  for h in $(seq 1 $((HOSTS - 1))); do
    ok=0
    for _ in $(seq 1 50); do
      if ip netns exec "$(fab_ns 0)" ping -c1 -W1 -q -I "$(fab_if "$r")" "$(fab_ip "$h" "$r")" >/dev/null 2>&1; then ok=1; break; fi
      sleep 0.1
    done
    [ $ok = 1 ] || die "$(fab_ns 0) cannot reach $(fab_ip "$h" "$r") on $(fab_if "$r")"
  done
done

# Slurm topology.conf: one tree (every rail is a copy of it); LinkSpeed in
# Mbit/s, the host links' under each leaf, the uplinks' under the spine.
hostlist() { if [ "$1" = "$2" ]; then echo "$FAB_PREFIX$1"; else echo "$FAB_PREFIX[$1-$2]"; fi; }
topo() {
  echo "# Emulated fabric: $HOSTS hosts x $RAILS rails (each rail a copy of this tree), LinkSpeed in Mbit/s"
  for l in $(seq 0 $((LEAVES - 1))); do
    first=$((l * HOSTS_PER_LEAF)); last=$((first + HOSTS_PER_LEAF - 1))
    [ "$last" -lt "$HOSTS" ] || last=$((HOSTS - 1))
    echo "SwitchName=leaf$l Nodes=$(hostlist "$first" "$last") LinkSpeed=$RATE"
  done
  if [ "$LEAVES" -gt 1 ]; then
    echo "SwitchName=spine Switches=leaf[0-$((LEAVES - 1))] LinkSpeed=$(awk -v k="$UP_KBIT" 'BEGIN{printf "%g", k/1000}')"
  fi
}
mkdir -p "$(dirname "$TOPO_OUT")" "$(dirname "$FAB_ENV")"
topo >"$TOPO_OUT"
hosts_csv=$(seq 0 $((HOSTS - 1)) | sed "s/^/$FAB_PREFIX/" | paste -sd,)
cat >"$FAB_ENV" <<ENV
FAB_HOSTS=$hosts_csv
FAB_NHOSTS=$HOSTS
FAB_MASTER_ADDR=$(fab_ip 0 0)
FAB_IFNAME=rail
FAB_RAILS=$RAILS
FAB_RATE=$RATE
FAB_OVERSUB=$OVERSUB
FAB_HOSTS_PER_LEAF=$HOSTS_PER_LEAF
FAB_LEAVES=$LEAVES
FAB_UPLINK_KBIT=$UP_KBIT
FAB_OFFLOAD=$OFFLOAD
FAB_NEIGH=$NEIGH
FAB_TOPO=$TOPO_OUT
ENV
log "ready; topology in $TOPO_OUT, env in $FAB_ENV"
cat "$TOPO_OUT"
