//! A loop of all-reduces for the RAS test (`scripts/ras-test.sh`): run
//! under a launcher (`ncclrun`), for `--seconds` of rank 0's clock (rank 0's
//! verdict travels in each all-reduce, so every rank stops after the same
//! call). With `--log DIR`, each rank keeps the sequence number of the
//! call it is about to start in `DIR/rank<R>` (overwritten in place), so a
//! test can compare what RAS reports of a stopped rank.

use nccl_rs::{Communicator, Config, RedOp};
use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    nccl_rs::init_logging();
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds: f64 = arg("--seconds").map_or(Ok(10.0), |v| v.parse())?;
    let count: usize = arg("--count").map_or(Ok(1024), |v| v.parse())?;
    let config = Config::from_env()?;
    let mut comm = Communicator::init_from_env(&config)?;
    let rank = comm.rank();
    let mut log = match arg("--log") {
        Some(dir) => Some(std::fs::File::create(format!("{dir}/rank{rank}"))?),
        None => None,
    };
    let start = Instant::now();
    let until = Duration::from_secs_f64(seconds);
    let mut send = vec![1.0f32; count];
    let mut recv = vec![0.0f32; count];
    let mut seq = 0u64;
    loop {
        seq += 1;
        if let Some(f) = &mut log {
            f.seek(SeekFrom::Start(0))?;
            write!(f, "{seq:<20}")?;
        }
        send[0] = match rank == 0 && start.elapsed() < until {
            true => 1.0,
            false => 0.0,
        };
        comm.all_reduce(&send, &mut recv, RedOp::Sum)?;
        if recv[1] != comm.size() as f32 {
            return Err(format!("rank {rank}: op {seq}: got {} ", recv[1]).into());
        }
        if recv[0] == 0.0 {
            break;
        }
    }
    comm.finalize()?;
    if rank == 0 {
        println!("ras_loop: {seq} all-reduces of {count} floats");
    }
    Ok(())
}
