//! One rank of the fault tests. `FAULT` selects the scenario:
//! - `mismatch`: rank `FAULT_RANK` calls broadcast where the others call
//!   all_reduce, as operation #3;
//! - `die`: rank `FAULT_RANK` kills itself (SIGKILL) in the middle of a
//!   64 MiB all-reduce;
//! - `die_shared`, `mismatch_shared`: the same on shared buffers
//!   (`ShmBuffer`), which take the zero-copy path;
//! - `stop`: rank `FAULT_RANK` stops itself (SIGSTOP) in a loop of
//!   all-reduces; the others fail at `NCCL_RS_TIMEOUT` and must exit promptly;
//! - `none`: everyone runs the same all-reduces.
//!
//! With `ROOT_DELAY_FILE`, rank 0 starts the bootstrap root (not knowing
//! the job size) and joins only once that file exists, so a test can reach
//! the root before any rank does.
//!
//! Every rank prints `RESULT <rank> ok|err <elapsed ms> <error>` (an init
//! that fails prints `RESULT <rank> err 0 <error>`) and exits 0; the test
//! reads the lines.

use nccl_rs::{Communicator, Config, RedOp, ShmBuffer, UniqueId};
use std::time::{Duration, Instant};

/// Joins as the launcher's environment says; rank 0 may first wait for
/// `ROOT_DELAY_FILE` with its root already listening.
fn init(cfg: &Config) -> Result<Communicator, String> {
    let Ok(delay) = std::env::var("ROOT_DELAY_FILE") else {
        return Communicator::init_from_env(cfg).map_err(|e| e.to_string());
    };
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} unset"));
    let rank: usize = var("RANK")?.parse().map_err(|_| "bad RANK")?;
    let n: usize = var("WORLD_SIZE")?.parse().map_err(|_| "bad WORLD_SIZE")?;
    let root = format!("{}:{}", var("MASTER_ADDR")?, var("MASTER_PORT")?);
    let id = UniqueId::from_rendezvous(&root, cfg).map_err(|e| e.to_string())?;
    if rank == 0 {
        id.start_root(cfg).map_err(|e| e.to_string())?;
        let start = Instant::now();
        while !std::path::Path::new(&delay).exists() && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Communicator::init(&id, n, rank, cfg).map_err(|e| e.to_string())
}

fn main() {
    nccl_rs::init_logging();
    let fault = std::env::var("FAULT").unwrap_or_else(|_| "none".into());
    let bad: usize = std::env::var("FAULT_RANK")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let cfg = Config::from_env().expect("config");
    let mut comm = match init(&cfg) {
        Ok(c) => c,
        Err(e) => {
            let rank = std::env::var("RANK").unwrap_or_default();
            println!("RESULT {rank} err 0 {e}");
            return;
        }
    };
    let rank = comm.rank();
    let mut small = vec![1.0f32; 1024];
    for _ in 0..2 {
        comm.all_reduce_in_place(&mut small, RedOp::Sum)
            .expect("warm-up");
    }
    let start = Instant::now();
    let res = match fault.as_str() {
        "mismatch" if rank == bad => comm.broadcast_in_place(&mut small, 0),
        "mismatch" => comm.all_reduce_in_place(&mut small, RedOp::Sum),
        "mismatch_shared" => {
            let mut buf = ShmBuffer::<f32>::zeroed(1 << 16).expect("shared buffer");
            comm.all_reduce_in_place(&mut buf, RedOp::Sum)
                .expect("warm-up");
            if rank == bad {
                comm.broadcast_in_place(&mut buf, 0)
            } else {
                comm.all_reduce_in_place(&mut buf, RedOp::Sum)
            }
        }
        "die" | "die_shared" => {
            let mut heap = Vec::new();
            let mut shared = None;
            let big: &mut [f32] = if fault == "die" {
                heap.resize(16 << 20, 1.0f32);
                &mut heap
            } else {
                shared.insert(ShmBuffer::<f32>::zeroed(16 << 20).expect("shared buffer"))
            };
            if rank == bad {
                std::thread::spawn(|| {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    // SAFETY: raising a signal at our own process has no
                    // memory-safety preconditions.
                    unsafe { libc_kill_self() };
                });
            }
            let mut r = Ok(());
            for _ in 0..50 {
                r = comm.all_reduce_in_place(big, RedOp::Sum);
                if r.is_err() {
                    break;
                }
            }
            r
        }
        "stop" => {
            let mut r = Ok(());
            for i in 0..100_000 {
                if rank == bad && i == 20 {
                    println!("STOPPING {rank}");
                    // SAFETY: raising a signal at our own process has no
                    // memory-safety preconditions.
                    unsafe { signal_self(19) };
                }
                r = comm.all_reduce_in_place(&mut small, RedOp::Sum);
                if r.is_err() {
                    break;
                }
            }
            r
        }
        _ => comm.all_reduce_in_place(&mut small, RedOp::Sum),
    };
    let ms = start.elapsed().as_millis();
    match res {
        Ok(()) => println!("RESULT {rank} ok {ms}"),
        Err(e) => println!("RESULT {rank} err {ms} {e}"),
    }
    drop(comm);
}

/// Sends SIGKILL to this process.
///
/// # Safety
/// None beyond the process ending at once.
unsafe fn libc_kill_self() {
    // SAFETY: forwarded.
    unsafe { signal_self(9) }
}

/// Sends signal `sig` to this process.
///
/// # Safety
/// None beyond what the signal does to the process (SIGKILL ends it,
/// SIGSTOP stops it).
unsafe fn signal_self(sig: i32) {
    extern "C" {
        fn getpid() -> i32;
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: plain syscalls with valid arguments.
    unsafe {
        kill(getpid(), sig);
    }
}
