//! `libnccl.so.2` from nccl-rs: NVIDIA NCCL's C API over the Rust core.
//!
//! A program written against NVIDIA's `nccl.h` compiles against
//! `include/nccl.h` (our own header, with NCCL's names, values and layouts)
//! and links against this library unchanged. See `README.md` for the
//! host-memory semantics, what is implemented, and how to build and test.
//!
//! # Layout
//! * `types`: the C types. `panic`: the panic boundary and the
//!   `nccl_api!` macro that defines each function with its `pnccl` twin.
//! * `error`: the one mapping from core errors to `ncclResult_t`;
//!   `last_error`: each thread's last-error text. `handle`: checked
//!   `ncclComm_t` handles.
//! * `comm`: a communicator's state and the one place its work runs;
//!   `worker`: a communicator's proxy thread (non-blocking communicators,
//!   and calls on device memory that return at once); `gate`: those
//!   calls' gates on their streams (the `cuda` feature);
//!   `group`: `ncclGroupStart`/`End` and the path every call is issued by;
//!   `device`: device pointers and streams (the `cuda` feature).
//! * `work`: what a call becomes (and the modules' layering); `redop`:
//!   the reductions a collective runs with (`ops` is their API).
//! * `init`, `manage`, `coll`, `ops`, `mem`: the API, grouped as `nccl.h`.
//!   `stubs`: functions not implemented yet (`ncclInvalidUsage`).
//!   `config`: `ncclConfig_t` read by its `size`. `logging`: `NCCL_DEBUG*`.
//!
//! # Thread safety
//! Every function may be called from any thread. Groups are per thread. A
//! communicator is used by one thread at a time (as in NCCL); calls from
//! two threads on one communicator are serialised, not undefined.
//! `ncclCommAbort` may be called from another thread while an operation
//! runs: the operation returns an error and the communicator is freed.
//!
//! # Resource cleanup
//! `ncclCommDestroy` / `ncclCommAbort` free a communicator; its handle is
//! dead afterwards and using it gives `ncclInvalidArgument`.

pub mod coll;
mod comm;
mod config;
mod device;
pub mod error;
mod gate;
pub mod group;
mod handle;
pub mod init;
mod last_error;
mod logging;
pub mod manage;
pub mod mem;
pub mod ops;
mod panic;
mod redop;
pub mod stubs;
pub mod types;
mod work;
mod worker;

pub use error::map_error;
pub use types::*;
