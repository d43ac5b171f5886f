//! `alltoall_perf`: measures and checks `alltoall` like nccl-tests; see `-h`.

fn main() -> std::process::ExitCode {
    nccl_perf::perf_main(nccl_perf::Collective::AllToAll)
}
