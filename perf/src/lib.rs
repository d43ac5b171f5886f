//! Performance tools for nccl-rs in the style of NVIDIA's nccl-tests.
//!
//! Each binary (`all_reduce_perf`, `all_gather_perf`, `reduce_scatter_perf`,
//! `broadcast_perf`, `reduce_perf`, `alltoall_perf`, `sendrecv_perf`) calls
//! [`perf_main`] with its [`Collective`]; the flags, sizes, bandwidth
//! formulas and table follow nccl-tests. Ranks are threads of one process
//! (`-t N`), the processes of a launcher (`ncclrun -n N`, torchrun, mpirun,
//! srun), or a single rank. With `--device 1` (the `cuda` feature) the
//! buffers are in GPU memory; see [`device`].
//!
//! `fabric_check` validates a fabric (every host pair on every rail, an
//! all-reduce, the outliers named); its decisions are in [`fcheck`] and it
//! is described in `docs/fabric_check.md`.

pub mod args;
pub mod bind;
pub mod check;
pub mod coll;
pub mod data;
pub mod device;
pub mod exec;
pub mod fcheck;
pub mod run;
pub mod table;
pub mod timing;

pub use coll::Collective;
pub use run::perf_main;
