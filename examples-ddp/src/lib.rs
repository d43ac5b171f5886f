//! Data-parallel training over nccl-rs, the way PyTorch DDP does it: the
//! library behind the `ddp_train` example.
//!
//! ```text
//! cargo build --release -p nccl-perf -p nccl-ddp-example --bins --examples
//! target/release/ncclrun -n 4 target/release/examples/ddp_train
//! ```
//!
//! # What it does
//! - Every rank builds the same MLP from the same seed, and rank 0's
//!   parameters are broadcast anyway ([`Communicator::broadcast_in_place`]),
//!   as DDP's constructor does.
//! - Each epoch, every rank draws the same seeded shuffle of the training
//!   split; global batch `k` is `perm[k*B..(k+1)*B]`, and rank `r` takes its
//!   samples `r, r+n, r+2n, ...` (`B/n` of them) — a `DistributedSampler`
//!   with `drop_last`.
//! - Backward runs layer by layer from the last; gradients go straight into
//!   buckets of about `--bucket-bytes` (25 MiB by default, DDP's
//!   `bucket_cap_mb`), and a bucket's [`Communicator::all_reduce_async`]
//!   with [`RedOp::Avg`] starts the moment its last gradient is ready, so it
//!   overlaps the rest of backward. The optimizer waits for every bucket
//!   ([`AsyncOp::wait`]) before it steps. See [`ddp`].
//! - Since every rank's local batch has `B/n` samples, the average of the
//!   ranks' mean gradients is the mean gradient over the global batch: the
//!   run is the same SGD as one process with batch `B`, up to the order of
//!   floating-point sums.
//!
//! # Why these choices
//! - **Dataset**: [`linfa_datasets`] embeds the UCI red-wine-quality (1599
//!   samples, 11 features, 6 quality classes) and iris (150 samples) tables
//!   as gzipped CSV inside the crate (`include_bytes!`), so nothing is
//!   downloaded at run time; its dependencies (ndarray, csv, flate2) build
//!   in well under a minute. Wine is the default: large enough that the
//!   shards and the throughput mean something, and a real, noisy task
//!   (majority class 42.6%); iris is there as the easy check.
//! - **Model and gradients in plain Rust, not candle**: (1) DDP's overlap
//!   needs a hook when *each* parameter's gradient is final during
//!   backward; candle's `Tensor::backward` returns all gradients at once in
//!   a `GradStore`, so with candle the all-reduce could only start after
//!   backward, and the example could not show the overlap that
//!   `all_reduce_async` exists for. (2) candle-core with its gemm kernels
//!   takes many minutes to build in release on a small CI machine, in
//!   every CI run, for a model of a few thousand parameters.
//!   A small MLP with explicit backprop ([`mlp`]) is checked against
//!   finite differences in its unit tests.
//!   The same training on candle-nn, with these two costs, is the
//!   `candle_ddp` program in `examples-candle/` (a workspace of its own).
//!
//! [`AsyncOp::wait`]: nccl_rs::comm::AsyncOp::wait
//! [`Communicator::broadcast_in_place`]: nccl_rs::Communicator::broadcast_in_place
//! [`Communicator::all_reduce_async`]: nccl_rs::Communicator::all_reduce_async
//! [`RedOp::Avg`]: nccl_rs::RedOp::Avg

#![forbid(unsafe_code)]

pub mod args;
pub mod data;
pub mod ddp;
pub mod mlp;
pub mod report;
pub mod rng;
pub mod run_files;
pub mod train;

pub use args::Args;
pub use train::{connect, main_with_args, train, Outcome};
