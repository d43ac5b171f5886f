//! Shared helpers of the nccl-rs test suite: exact input generators, a
//! reference reduction, the case matrix, and a process launcher.

pub mod cases;
pub mod data;
pub mod launch;
