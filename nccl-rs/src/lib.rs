//! nccl-rs: collective communication with NVIDIA NCCL's semantics, in Rust.
//!
//! # Quick start
//! ```no_run
//! use nccl_rs::{Communicator, Config, RedOp};
//! # fn main() -> nccl_rs::Result<()> {
//! nccl_rs::init_logging();
//! let config = Config::from_env()?;
//! // Under `ncclrun -n 4`, torchrun, mpirun or srun:
//! let mut comm = Communicator::init_from_env(&config)?;
//! let send = vec![comm.rank() as f32; 1024];
//! let mut recv = vec![0.0f32; 1024];
//! comm.all_reduce(&send, &mut recv, RedOp::Sum)?;
//! # Ok(()) }
//! ```
//!
//! # Layers
//! `comm` (the [`Communicator`]) → `plan` (algorithm and chunking per call) →
//! `schedule` (pure step lists, no I/O) → `engine` (runs steps over the
//! transport, owns staging buffers and deadlines) → transport (the
//! [`nccl_net`] trait: TCP, or the in-memory test transport).
//!
//! # Thread safety
//! A [`Communicator`] is `Send` but is used by one thread at a time: every
//! collective takes `&mut self`. Ranks of one job may be threads of one
//! process, each with its own communicator.
//!
//! # Resource cleanup
//! Dropping a communicator closes its connections; there is nothing else to
//! call.

pub mod bootstrap;
pub mod comm;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod datatype;
mod engine;
pub mod error;
pub mod fp8;
#[doc(hidden)]
pub mod fuzzing;
pub mod hostmem;
pub mod json;
#[doc(hidden)]
pub mod kernels;
pub mod launch;
mod logging;
/// Seeing inside a running job: per-peer telemetry and its Prometheus file,
/// per-rank progress for the RAS service.
pub mod observe;
mod plan;
pub mod planning;
mod profiler;
pub mod ras;
mod reduce;
pub mod schedule;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
pub mod topo;
pub mod transport;

pub use bootstrap::UniqueId;
pub use comm::{Communicator, P2pGroup};
pub use config::{Config, CudaConfig, LogSettings};
pub use datatype::{DataType, Element, RedOp};
pub use error::{Error, Result};
pub use hostmem::ShmBuffer;
pub use logging::{init_logging, init_logging_to};
pub use plan::placement::{Placement, PlacementMode};
