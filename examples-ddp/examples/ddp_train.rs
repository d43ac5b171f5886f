//! Data-parallel training of an MLP on the red-wine-quality dataset over
//! nccl-rs, PyTorch DDP style: bucketed gradient all-reduce overlapped with
//! backward. See the `nccl_ddp` crate docs for the design.
//!
//! ```text
//! target/release/ncclrun -n 4 target/release/examples/ddp_train --epochs 30
//! RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 target/release/examples/ddp_train &
//! RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 target/release/examples/ddp_train
//! target/release/examples/ddp_train --help
//! ```

fn main() -> std::process::ExitCode {
    nccl_ddp::main_with_args(std::env::args().skip(1))
}
