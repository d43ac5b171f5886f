//! Data-parallel training of a candle-nn MLP on the red-wine-quality dataset
//! over nccl-rs. See the `nccl_candle` crate docs for the design.
//!
//! ```text
//! target/release/ncclrun -n 4 target/release/candle_ddp --epochs 30
//! target/release/candle_ddp --help
//! ```

fn main() -> std::process::ExitCode {
    nccl_candle::main_with_args(std::env::args().skip(1))
}
