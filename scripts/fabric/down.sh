#!/usr/bin/env bash
# Removes the emulated fabric: every namespace fab-hN and fab-sw (with them
# go their veths, bridges and qdiscs), after killing the processes still
# inside them, and the files up.sh wrote under /run/fab. Touches nothing in
# the root namespace. Safe to run when nothing exists.
#
#   TOPO_OUT=path   the topology.conf up.sh wrote elsewhere (removed too)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
for ns in $(fab_existing_ns); do
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
done
rm -f "$FAB_RUN_DIR/topology.conf" "$FAB_ENV" ${TOPO_OUT:+"$TOPO_OUT"}
rmdir "$FAB_RUN_DIR" 2>/dev/null || true
left=$(fab_existing_ns)
if [ -n "$left" ]; then
  echo "fabric down: could not remove: $left" >&2
  exit 1
fi
exit 0
