//! The `ddp_train` example as a binary target, so that the integration
//! tests can spawn it through `CARGO_BIN_EXE_ddp_train_bin`.

fn main() -> std::process::ExitCode {
    nccl_ddp::main_with_args(std::env::args().skip(1))
}
