//! A fixed schedule of all-reduces for the RAS telemetry test
//! (`scripts/ras-telemetry-test.sh`): under a launcher (`ncclrun`), each
//! rank writes `ready` to `DIR/rank<R>` (`--log DIR`) once its
//! communicator is up, waits for the file `--go` (so the test can set up
//! the network first), runs `--iters` all-reduces of `--count` floats, writes
//! `done` to its log, then holds the communicator,
//! idle, until the file `--hold` exists, so that RAS can be asked about a
//! job whose counters no longer move. Every wait has a deadline
//! (`--deadline` seconds, default 120).

use nccl_rs::{Communicator, Config, RedOp};
use std::path::Path;
use std::time::{Duration, Instant};

fn wait_for(path: &str, deadline: Instant) -> Result<(), String> {
    while !Path::new(path).exists() {
        if Instant::now() >= deadline {
            return Err(format!("{path} did not appear before the deadline"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    nccl_rs::init_logging();
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let iters: u64 = arg("--iters").map_or(Ok(10), |v| v.parse())?;
    let count: usize = arg("--count").map_or(Ok(1 << 16), |v| v.parse())?;
    let secs: u64 = arg("--deadline").map_or(Ok(120), |v| v.parse())?;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let config = Config::from_env()?;
    let mut comm = Communicator::init_from_env(&config)?;
    let rank = comm.rank();
    let log = |what: &str| -> std::io::Result<()> {
        match arg("--log") {
            Some(dir) => std::fs::write(format!("{dir}/rank{rank}"), format!("{what}\n")),
            None => Ok(()),
        }
    };
    log("ready")?;
    if let Some(go) = arg("--go") {
        wait_for(&go, deadline)?;
    }
    let send = vec![1.0f32; count];
    let mut recv = vec![0.0f32; count];
    for i in 0..iters {
        comm.all_reduce(&send, &mut recv, RedOp::Sum)?;
        if recv.iter().any(|&x| x != comm.size() as f32) {
            return Err(format!("rank {rank}: all-reduce {i}: wrong sum").into());
        }
    }
    log("done")?;
    if let Some(hold) = arg("--hold") {
        wait_for(&hold, deadline)?;
    }
    comm.finalize()?;
    if rank == 0 {
        println!("ras_telemetry: {iters} all-reduces of {count} floats");
    }
    Ok(())
}
