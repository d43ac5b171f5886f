//! Data-parallel training of a [candle](candle_nn) model over nccl-rs: the
//! library behind the `candle_ddp` program.
//!
//! ```text
//! cargo build --release -p nccl-perf --bin ncclrun
//! cargo build --release --manifest-path examples-candle/Cargo.toml --target-dir target
//! target/release/ncclrun -n 4 target/release/candle_ddp
//! ```
//!
//! # What it does
//! It is `examples-ddp`'s `ddp_train` (same dataset, sharding, flags, logs
//! and checks) with the hand-written MLP replaced by candle:
//! - The model is `candle_nn::Linear` layers with ReLU ([`model::Mlp`]),
//!   its parameters in a `candle_nn::VarMap`. Every rank initialises them
//!   from one seed, then rank 0's flattened parameters are broadcast
//!   ([`Communicator::broadcast_in_place`]), as DDP's constructor does.
//! - Per step each rank runs candle's forward and `cross_entropy` on its
//!   shard of the global batch, and `Tensor::backward` gives a `GradStore`.
//! - [`train::all_reduce_grads`] copies the gradients into buckets of
//!   about `--bucket-bytes` in reverse parameter order (the order backward
//!   produces them), and starts each bucket's
//!   [`Communicator::all_reduce_async`] with [`RedOp::Avg`] as soon as its
//!   last gradient is in, so its reduction runs while the next buckets are
//!   filled; then it waits for every bucket and puts the averaged
//!   gradients back into the `GradStore`. The bucketing is
//!   `nccl_ddp::ddp::Reducer`, shared with `ddp_train`.
//! - A `candle_nn::Optimizer` takes that `GradStore`: candle-nn's `AdamW`
//!   (the default) or [`optim::SgdMomentum`]. Same parameters and same
//!   averaged gradients on every rank give the same update everywhere.
//! - At the end every rank hashes its parameters' bits
//!   ([`model::hash_params`]) and all-gathers the hashes; a mismatch is an
//!   error.
//!
//! # What differs from PyTorch DDP
//! candle's `backward` returns every gradient at once, with no per-parameter
//! hook, so the all-reduces cannot overlap the backward computation itself,
//! only the copying of the other buckets (`ddp_train`'s hand-written
//! backward shows the full overlap).
//!
//! # Why a crate of its own, outside the main workspace
//! candle-core brings gemm, safetensors, zip and rayon. As a separate
//! workspace (`examples-candle/Cargo.toml` has its own `[workspace]` and
//! `Cargo.lock`), its build is paid only by the stage that runs it, not by
//! every `cargo build --workspace`.
//!
//! [`Communicator::broadcast_in_place`]: nccl_rs::Communicator::broadcast_in_place
//! [`Communicator::all_reduce_async`]: nccl_rs::Communicator::all_reduce_async
//! [`RedOp::Avg`]: nccl_rs::RedOp::Avg

#![forbid(unsafe_code)]

pub mod model;
pub mod optim;
pub mod train;

pub use train::{main_with_args, train, Opts};
