//! One rank of the multi-process test matrix. Started N times by the test
//! (torchrun-style environment); runs every selected case, checks results
//! bit for bit, prints failures, and exits non-zero if any case failed.
//!
//! `NCCL_RS_TEST_SEED` (default 1) seeds the data and the sample;
//! `NCCL_RS_FULL_MATRIX=1` runs every case instead of the sample;
//! `NCCL_RS_LARGE_EVERY` (default 20) keeps 1 in N large cases;
//! `NCCL_RS_TEST_BUFFERS` = `vec` (default) | `shared` | `mixed` chooses
//! where buffers live (see `cases::BufferMode`);
//! `NCCL_RS_TEST_FILTER`, if set, keeps only the selected cases whose
//! `Debug` form contains it (e.g. `coll: AllReduce, dtype: Float32`).

use nccl_rs::{Communicator, Config};
use nccl_tests_suite::cases::{matrix, run, select, BufferMode};

fn main() {
    nccl_rs::init_logging();
    let env = |k: &str| std::env::var(k).ok();
    let seed: u64 = env("NCCL_RS_TEST_SEED")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let full = env("NCCL_RS_FULL_MATRIX").as_deref() == Some("1");
    let every: u64 = env("NCCL_RS_LARGE_EVERY")
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
        .max(1);
    let config = Config::from_env().unwrap_or_else(|e| fail(&format!("config: {e}")));
    let mut comm =
        Communicator::init_from_env(&config).unwrap_or_else(|e| fail(&format!("init: {e}")));
    let (rank, n) = (comm.rank(), comm.size());
    let mut cases = select(&matrix(n), seed, full, every);
    if let Some(f) = env("NCCL_RS_TEST_FILTER").filter(|f| !f.is_empty()) {
        cases.retain(|c| format!("{c:?}").contains(&f));
    }
    let mode = match BufferMode::from_env() {
        BufferMode::Vec => String::new(),
        m => format!(" ({m:?} buffers)"),
    };
    let started = std::time::Instant::now();
    let mut failed = 0;
    for (i, case) in cases.iter().enumerate() {
        match run(&mut comm, case, seed.wrapping_add(i as u64)) {
            Ok(0) => {}
            Ok(wrong) => {
                failed += 1;
                println!("rank {rank}: FAIL case {i} {case:?}: {wrong} wrong elements");
            }
            Err(e) => fail(&format!("rank {rank}: ERROR case {i} {case:?}: {e}")),
        }
    }
    println!(
        "rank {rank} of {n}: {} cases{mode}, {failed} failed, {:.1} s",
        cases.len(),
        started.elapsed().as_secs_f64()
    );
    drop(comm);
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

fn fail(msg: &str) -> ! {
    println!("{msg}");
    std::process::exit(2)
}
