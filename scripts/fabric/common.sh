# Shared names of the emulated leaf-spine, multi-rail fabric (sourced by
# up.sh, down.sh and check.sh; see docs/fabric.md).
#
# Hosts are namespaces fab-h0..fab-h(N-1); every switch lives in the one
# namespace fab-sw. Host H has one interface per rail, railR, with address
# 10.(90+R).0.(H+1)/24: each rail is its own subnet and its own L2 network.
FAB_PREFIX=${FAB_PREFIX:-fab-h}   # override both to run a second fabric beside this one
FAB_SWNS=${FAB_SWNS:-fab-sw}
FAB_RUN_DIR=${FAB_RUN_DIR:-/run/fab}
FAB_ENV=${FAB_ENV:-$FAB_RUN_DIR/env}
FAB_MAX_RAILS=8    # subnets 10.90.0.0/16 .. 10.97.0.0/16
FAB_MAX_HOSTS=253  # .1 .. .253 on each rail's /24

fab_ns() { echo "$FAB_PREFIX$1"; }                  # host H's namespace
fab_ip() { echo "10.$((90 + $2)).0.$(($1 + 1))"; }   # host H, rail R
fab_if() { echo "rail$1"; }                         # rail R's interface in a host
fab_mac() { printf '02:fa:b0:00:%02x:%02x\n' "$2" "$1"; } # host H's railR (locally administered)
# ip -batch lines giving host H's railR a permanent neighbour entry for
# every other of the N hosts (fab_ip and fab_mac of each, in one awk: no
# subshell per entry).
fab_neigh_cmds() { # H R N
  awk -v h="$1" -v r="$2" -v n="$3" 'BEGIN{for (p = 0; p < n; p++) if (p != h)
    printf "neigh replace 10.%d.0.%d lladdr 02:fa:b0:00:%02x:%02x dev rail%d nud permanent\n", 90 + r, p + 1, r, p, r}'
}
# In fab-sw: host H's port on rail R, leaf L's and the spine's bridges of
# rail R, and leaf L's uplink pair (leaf side "up", spine side "dn").
fab_port() { echo "r$2h$1"; }
fab_leaf() { echo "r$2leaf$1"; }
fab_spine() { echo "r$1spine"; }
fab_up() { echo "r$2l$1up"; }
fab_dn() { echo "r$2l$1dn"; }

# Namespaces of a fabric that exists now (any size), switch namespace last.
fab_existing_ns() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$FAB_PREFIX[0-9]+\$" || true
  ip netns list 2>/dev/null | awk '{print $1}' | grep -xF "$FAB_SWNS" || true
}
