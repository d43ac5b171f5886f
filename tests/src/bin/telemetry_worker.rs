//! One rank of the telemetry test: runs a known set of calls, prints its
//! `Communicator::stats()` as lines, checks that the Prometheus file
//! (`NCCL_RS_PROM_FILE`) was rewritten by its interval thread, then resets
//! the stats, runs one more all-reduce and prints them again.
//!
//! Each call moves blocks of [`BLOCK`] `f32` elements (1 KiB): small
//! enough for one chunk per step, below the zero-copy and placement-probe
//! sizes, so every message is one the schedule names.
//!
//! With `TELEMETRY_ZERO_COPY=1` (every rank on this host over shared
//! memory, `NCCL_RS_ZERO_COPY_MIN_BYTES` at most one block per rank) the
//! first phase starts with [`ZC_REPEAT`] all-reduces on shared buffers
//! (`ShmBuffer`), which take the zero-copy path. (First: once a call on
//! heap buffers found them not shared, the next eligible calls skip it.)
//!
//! Output lines (`PHASE` is `all` or `reset`):
//! - `PEER <phase> <peer> <bytes_sent> <bytes_recv> <msgs_sent> <msgs_recv> <errors>
//!   <direct_read> <direct_written>`
//! - `LAT <phase> <coll> <calls> <timed calls> <sum of bucket counts>`
//! - `PERIODIC ok|<why not>`
//! - `DONE`

use nccl_rs::{Communicator, Config, P2pGroup, RedOp, ShmBuffer};
use std::time::{Duration, Instant};

/// Elements per block.
const BLOCK: usize = 256;
/// Times each collective runs.
const REPEAT: usize = 3;
/// Zero-copy all-reduces.
const ZC_REPEAT: usize = 2;

fn print_stats(phase: &str, comm: &Communicator) {
    let s = comm.stats();
    for p in &s.peers {
        let e = p.errors;
        println!(
            "PEER {phase} {} {} {} {} {} {} {} {}",
            p.peer,
            p.bytes_sent,
            p.bytes_recv,
            p.msgs_sent,
            p.msgs_recv,
            e.io + e.protocol + e.timeout + e.other,
            p.direct_bytes_read,
            p.direct_bytes_written
        );
    }
    for h in &s.colls {
        println!(
            "LAT {phase} {} {} {} {}",
            h.coll,
            h.calls,
            h.count,
            h.buckets.iter().sum::<u64>()
        );
    }
}

fn run() -> Result<(), String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let mut comm = Communicator::init_from_env(&cfg).map_err(|e| e.to_string())?;
    let (r, n) = (comm.rank(), comm.size());
    let err = |e: nccl_rs::Error| e.to_string();
    if std::env::var("TELEMETRY_STALL").as_deref() == Ok("1") {
        return stall(comm);
    }
    let zero_copy = std::env::var("TELEMETRY_ZERO_COPY").as_deref() == Ok("1");
    let all_reduces = REPEAT + if zero_copy { ZC_REPEAT } else { 0 };
    if zero_copy {
        let shm = |v: f32| -> Result<ShmBuffer<f32>, String> {
            let mut b = ShmBuffer::<f32>::zeroed(n * BLOCK).map_err(err)?;
            b.iter_mut().for_each(|x| *x = v);
            Ok(b)
        };
        let (send, mut recv) = (shm(1.0)?, shm(0.0)?);
        for _ in 0..ZC_REPEAT {
            comm.all_reduce(&send, &mut recv, RedOp::Sum).map_err(err)?;
            if recv.iter().any(|&x| x != n as f32) {
                return Err("zero-copy all_reduce result".into());
            }
        }
    }
    for _ in 0..REPEAT {
        let send = vec![1.0f32; n * BLOCK];
        let mut recv = vec![0.0f32; n * BLOCK];
        comm.all_reduce(&send, &mut recv, RedOp::Sum).map_err(err)?;
        if recv.iter().any(|&x| x != n as f32) {
            return Err("all_reduce result".into());
        }
        let mine = vec![r as f32; BLOCK];
        comm.all_gather(&mine, &mut recv).map_err(err)?;
        let mut out = vec![0.0f32; BLOCK];
        comm.reduce_scatter(&send, &mut out, RedOp::Sum)
            .map_err(err)?;
        let mut b = vec![r as f32; BLOCK];
        comm.broadcast_in_place(&mut b, 0).map_err(err)?;
        if b.iter().any(|&x| x != 0.0) {
            return Err("broadcast result".into());
        }
        comm.all_to_all(&send, &mut recv).map_err(err)?;
    }
    // One send/recv group: 100 bytes to the next rank, from the previous.
    if n > 1 {
        let out = [7u8; 100];
        let mut inb = [0u8; 100];
        let mut g = P2pGroup::new();
        g.send(&out, (r + 1) % n);
        g.recv(&mut inb, (r + n - 1) % n);
        comm.run_group(g).map_err(err)?;
    }
    print_stats("all", &comm);

    // The interval thread rewrites the file: it soon shows every call.
    let periodic = match std::env::var("NCCL_RS_PROM_FILE") {
        Ok(t) => {
            let path = t.replace("{rank}", &r.to_string());
            let want = format!("coll=\"all_reduce\"}} {all_reduces}");
            let start = Instant::now();
            loop {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if text
                    .lines()
                    .any(|l| l.starts_with("nccl_rs_collective_calls_total") && l.ends_with(&want))
                {
                    break "ok".to_string();
                }
                if start.elapsed() > Duration::from_secs(5) {
                    break format!("{path} not rewritten within 5 s");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Err(_) => "no file".into(),
    };
    println!("PERIODIC {periodic}");

    comm.reset_stats();
    let send = vec![1.0f32; n * BLOCK];
    let mut recv = vec![0.0f32; n * BLOCK];
    comm.all_reduce(&send, &mut recv, RedOp::Sum).map_err(err)?;
    print_stats("reset", &comm);
    comm.finalize().map_err(err)?;
    // Dropping the communicator writes the file a last time.
    drop(comm);
    println!("DONE");
    Ok(())
}

/// `TELEMETRY_STALL=1`: rank 1 never calls; rank 0's all-reduce waits on
/// it until `NCCL_RS_TIMEOUT`. Rank 0 prints
/// `STALL <failed 0|1> <elapsed ns> <recv wait on 1 ns> <timeouts on 1> <other errors on 1>`.
fn stall(mut comm: Communicator) -> Result<(), String> {
    if comm.rank() != 0 {
        std::thread::sleep(Duration::from_secs(2));
        println!("DONE");
        return Ok(());
    }
    let n = comm.size();
    let send = vec![1.0f32; n * BLOCK];
    let mut recv = vec![0.0f32; n * BLOCK];
    let start = Instant::now();
    let res = comm.all_reduce(&send, &mut recv, RedOp::Sum);
    let elapsed = start.elapsed();
    let p = comm.stats().peers[1].clone();
    let e = p.errors;
    println!(
        "STALL {} {} {} {} {}",
        u8::from(res.is_err()),
        elapsed.as_nanos(),
        p.recv_wait.as_nanos(),
        e.timeout,
        e.io + e.protocol + e.other
    );
    drop(comm);
    println!("DONE");
    Ok(())
}

fn main() {
    nccl_rs::init_logging();
    if let Err(e) = run() {
        println!("FAILED {e}");
        std::process::exit(1);
    }
}
