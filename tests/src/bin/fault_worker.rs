//! One rank of the fault tests. `FAULT` selects the scenario:
//! - `mismatch`: rank `FAULT_RANK` calls broadcast where the others call
//!   all_reduce, as operation #3;
//! - `die`: rank `FAULT_RANK` kills itself (SIGKILL) in the middle of a
//!   64 MiB all-reduce;
//! - `die_shared`, `mismatch_shared`: the same on shared buffers
//!   (`ShmBuffer`), which take the zero-copy path;
//! - `none`: everyone runs the same all-reduces.
//!
//! Every rank prints `RESULT <rank> ok|err <elapsed ms> <error>` and exits
//! 0; the test reads the lines.

use nccl_rs::{Communicator, Config, RedOp, ShmBuffer};
use std::time::Instant;

fn main() {
    nccl_rs::init_logging();
    let fault = std::env::var("FAULT").unwrap_or_else(|_| "none".into());
    let bad: usize = std::env::var("FAULT_RANK")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let cfg = Config::from_env().expect("config");
    let mut comm = Communicator::init_from_env(&cfg).expect("init");
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
    extern "C" {
        fn getpid() -> i32;
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: plain syscalls with valid arguments.
    unsafe {
        kill(getpid(), 9);
    }
}
