//! `all_gather_perf`: measures and checks `all_gather` like nccl-tests; see `-h`.

fn main() -> std::process::ExitCode {
    nccl_perf::perf_main(nccl_perf::Collective::AllGather)
}
