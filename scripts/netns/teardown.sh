#!/usr/bin/env bash
# Removes the fault-test namespaces (and with them their veths, bridge and
# nftables rules). Idempotent; kills processes still inside them first.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
for ns in $(seq 0 $((NETNS_N - 1)) | sed "s/^/$NETNS_PREFIX/") "$NETNS_BRNS"; do
  if ip netns list 2>/dev/null | grep -qw "^$ns"; then
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  fi
done
exit 0
