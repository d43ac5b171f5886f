//! The Rust side of `overhead.py`: a one-rank communicator running 8-byte
//! in-place all-reduces in a tight loop; prints the median nanoseconds per
//! call over `REPEATS` runs of `CALLS` calls (argument 1: calls per run).

use nccl_rs::{Communicator, Config, RedOp, UniqueId};
use std::time::Instant;

const REPEATS: usize = 7;

fn main() -> nccl_rs::Result<()> {
    let calls: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let config = Config::from_env()?;
    let id =
        UniqueId::new(&config).map_err(|source| nccl_rs::Error::Bootstrap { rank: 0, source })?;
    let mut comm = Communicator::init(&id, 1, 0, &config)?;
    let mut x = [0.0f32; 2];
    for _ in 0..1000 {
        comm.all_reduce_in_place(&mut x, RedOp::Sum)?;
    }
    let mut per_call = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        let t = Instant::now();
        for _ in 0..calls {
            comm.all_reduce_in_place(&mut x, RedOp::Sum)?;
        }
        per_call.push(t.elapsed().as_nanos() as f64 / calls as f64);
    }
    per_call.sort_by(f64::total_cmp);
    println!("{:.0}", per_call[REPEATS / 2]);
    Ok(())
}
