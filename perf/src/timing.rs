//! Timing: back-to-back operations under one timer, combined over ranks.

use std::time::Instant;

use nccl_rs::{Communicator, RedOp, Result};

use crate::args::Average;

/// Runs `op(i)` for `i` in `0..n` back to back and returns the seconds per
/// operation.
pub fn time_ops<E>(
    n: usize,
    mut op: impl FnMut(usize) -> std::result::Result<(), E>,
) -> std::result::Result<f64, E> {
    let start = Instant::now();
    for i in 0..n {
        op(i)?;
    }
    Ok(start.elapsed().as_secs_f64() / n.max(1) as f64)
}

/// Combines each rank's `secs` over the communicator as `-a` asks (the
/// maximum by default); every rank gets the result.
pub fn combine(comm: &mut Communicator, secs: f64, average: Average) -> Result<f64> {
    let mut v = [secs];
    match average {
        Average::Rank0 => comm.broadcast_in_place(&mut v, 0)?,
        Average::Mean => comm.all_reduce_in_place(&mut v, RedOp::Avg)?,
        Average::Min => comm.all_reduce_in_place(&mut v, RedOp::Min)?,
        Average::Max => comm.all_reduce_in_place(&mut v, RedOp::Max)?,
    }
    Ok(v[0])
}

/// Sums a count over the communicator.
pub fn sum_count(comm: &mut Communicator, count: u64) -> Result<u64> {
    let mut v = [count];
    comm.all_reduce_in_place(&mut v, RedOp::Sum)?;
    Ok(v[0])
}
