# Sourced by compare.sh, paired.sh and profile.sh: the perf tool that runs a
# collective (an op name as the peers' benches take it).
tool() {
  case $1 in
    allreduce) echo all_reduce_perf;; allgather) echo all_gather_perf;; reduce_scatter) echo reduce_scatter_perf;;
    broadcast) echo broadcast_perf;; alltoall) echo alltoall_perf;; sendrecv) echo sendrecv_perf;;
    *) echo "unknown op $1" >&2; exit 2;;
  esac
}
