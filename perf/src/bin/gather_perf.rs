//! `gather_perf`: measures and checks `gather` like nccl-tests; see `-h`.

fn main() -> std::process::ExitCode {
    nccl_perf::perf_main(nccl_perf::Collective::Gather)
}
