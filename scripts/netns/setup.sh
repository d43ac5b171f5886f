#!/usr/bin/env bash
# Creates the fault-test network: namespaces ncclns0..3 joined by the bridge
# ncclbr0 (in namespace ncclnsbr, which has 10.77.0.100 on it) through veth
# pairs, addresses 10.77.0.1..4/24, lo up everywhere. Idempotent: tears
# down first.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
bash "$here/teardown.sh"
ip netns add "$NETNS_BRNS"
ip -n "$NETNS_BRNS" link set lo up
ip -n "$NETNS_BRNS" link add "$NETNS_BRIDGE" type bridge
# No STP/forwarding delay: ports forward as soon as they are up.
ip -n "$NETNS_BRNS" link set "$NETNS_BRIDGE" type bridge stp_state 0 forward_delay 0
ip -n "$NETNS_BRNS" link set "$NETNS_BRIDGE" up
# The bridge's namespace is one more host on the subnet (the fault tests'
# stranger runs there).
ip -n "$NETNS_BRNS" addr add "$NETNS_SUBNET.$NETNS_STRANGER/24" dev "$NETNS_BRIDGE"
for r in $(seq 0 $((NETNS_N - 1))); do
  ns=$(netns_name "$r")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  # Create the pair directly across namespaces: vethR in ns, brpR on the bridge.
  ip -n "$ns" link add "$(netns_if "$r")" type veth peer name "brp$r" netns "$NETNS_BRNS"
  ip -n "$NETNS_BRNS" link set "brp$r" master "$NETNS_BRIDGE"
  ip -n "$NETNS_BRNS" link set "brp$r" up
  ip -n "$ns" addr add "$(netns_ip "$r")/24" dev "$(netns_if "$r")"
  ip -n "$ns" link set "$(netns_if "$r")" up
done
# Wait until every namespace reaches every other (bridge learning, DAD).
for r in $(seq 0 $((NETNS_N - 1))); do
  for p in $(seq 0 $((NETNS_N - 1))); do
    [ "$r" = "$p" ] && continue
    ok=0
    for _ in $(seq 1 50); do
      if ip netns exec "$(netns_name "$r")" ping -c1 -W1 -q "$(netns_ip "$p")" >/dev/null 2>&1; then ok=1; break; fi
      sleep 0.1
    done
    if [ $ok = 0 ]; then echo "netns setup: $(netns_name "$r") cannot reach $(netns_ip "$p")" >&2; exit 1; fi
  done
done
echo "netns setup: $NETNS_N namespaces on bridge $NETNS_BRIDGE ($NETNS_SUBNET.0/24)"
