//! `broadcast_perf`: measures and checks `broadcast` like nccl-tests; see `-h`.

fn main() -> std::process::ExitCode {
    nccl_perf::perf_main(nccl_perf::Collective::Broadcast)
}
