//! `scatter_perf`: measures and checks `scatter` like nccl-tests; see `-h`.

fn main() -> std::process::ExitCode {
    nccl_perf::perf_main(nccl_perf::Collective::Scatter)
}
