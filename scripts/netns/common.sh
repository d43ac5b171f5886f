# Shared names of the network-namespace fault tests (sourced by the scripts).
#
# Topology: four namespaces ncclns0..3, each with one interface vethR
# (10.77.0.(R+1)/24) whose peer brpR sits in a fifth namespace ncclnsbr and
# is enslaved to the bridge ncclbr0 there; ncclnsbr itself is 10.77.0.100
# on the bridge (the stranger of the garbage scenario). Nothing touches the root
# namespace's interfaces, routes or firewall: the test subnet exists only
# between these namespaces.
NETNS_N=${NETNS_N:-4}
NETNS_PREFIX=ncclns
NETNS_BRNS=ncclnsbr
NETNS_BRIDGE=ncclbr0
NETNS_SUBNET=10.77.0
NETNS_NFT_TABLE=nccl_fault
NETNS_STRANGER=100

netns_ip() { echo "$NETNS_SUBNET.$(($1 + 1))"; }
netns_name() { echo "$NETNS_PREFIX$1"; }
netns_if() { echo "veth$1"; }
