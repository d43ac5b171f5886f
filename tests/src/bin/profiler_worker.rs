//! One rank of the profiler plugin test (`tests/profiler.rs`): runs every
//! collective once, a send/recv group, an all-reduce on shared buffers and
//! a large all-reduce, printing its
//! pid and each call's buffer addresses for the test to match against the
//! plugin's record. Exit code 0 on success.

use nccl_rs::{Communicator, Config, P2pGroup, RedOp};

/// Elements of the last, large all-reduce.
const BIG: usize = 1 << 16;
/// Elements of the all-reduce on shared buffers (64 KiB).
const ZC: usize = 1 << 14;

fn main() {
    if let Err(e) = run() {
        eprintln!("profiler_worker: {e}");
        std::process::exit(1);
    }
}

fn addrs<A, B>(i: usize, send: &[A], recv: &[B]) {
    println!("op {i} send={:p} recv={:p}", send.as_ptr(), recv.as_ptr());
}

fn run() -> nccl_rs::Result<()> {
    nccl_rs::init_logging();
    let config = Config::from_env()?;
    let mut comm = Communicator::init_from_env(&config)?;
    let (n, r) = (comm.size(), comm.rank());
    println!("pid {}", std::process::id());

    let a = vec![r as f32 + 1.0; 5];
    let mut b = vec![0.0f32; 5];
    for i in 0..2 {
        addrs(i, &a, &b);
        comm.all_reduce(&a, &mut b, RedOp::Sum)?;
        let want = (n * (n + 1) / 2) as f32;
        if b != vec![want; 5] {
            return Err(nccl_rs::Error::InvalidArgument(format!(
                "all_reduce gave {b:?}"
            )));
        }
    }

    let root = 1 % n;
    let c = vec![7i32; 3];
    let mut d = vec![0i32; 3];
    addrs(2, &c, &d);
    comm.broadcast(&c, &mut d, root)?;

    let e = vec![2.0f64; 4];
    let mut f = vec![0.0f64; 4];
    addrs(3, &e, &f);
    comm.reduce(&e, &mut f, RedOp::Sum, 0)?;

    let g = vec![r as u8; 2];
    let mut h = vec![0u8; 2 * n];
    addrs(4, &g, &h);
    comm.all_gather(&g, &mut h)?;

    let k = vec![1.0f32; 3 * n];
    let mut l = vec![0.0f32; 3];
    addrs(5, &k, &l);
    comm.reduce_scatter(&k, &mut l, RedOp::Sum)?;

    let m = vec![r as i64; 2 * n];
    let mut o = vec![0i64; 2 * n];
    addrs(6, &m, &o);
    comm.all_to_all(&m, &mut o)?;

    let p = vec![r as f32; 7];
    let mut q = vec![0.0f32; 7];
    addrs(7, &p, &q);
    let mut group = P2pGroup::new();
    group.send(&p, (r + 1) % n);
    group.recv(&mut q, (r + n - 1) % n);
    comm.run_group(group)?;
    if q != vec![((r + n - 1) % n) as f32; 7] {
        return Err(nccl_rs::Error::InvalidArgument(format!("recv gave {q:?}")));
    }

    // Shared buffers, large enough for the zero-copy path where every
    // rank shares the host over shared memory.
    let mut zs = nccl_rs::ShmBuffer::<f32>::zeroed(ZC)?;
    zs.fill(1.0);
    let mut zr = nccl_rs::ShmBuffer::<f32>::zeroed(ZC)?;
    addrs(8, &zs, &zr);
    comm.all_reduce(&zs, &mut zr, RedOp::Sum)?;
    if zr.iter().any(|&v| v != n as f32) {
        return Err(nccl_rs::Error::InvalidArgument(
            "zero-copy all_reduce gave a wrong sum".into(),
        ));
    }

    // Large enough for several steps per peer (the test sets a small
    // NCCL_BUFFSIZE).
    let s = vec![1.0f32; BIG];
    let mut t = vec![0.0f32; BIG];
    addrs(9, &s, &t);
    comm.all_reduce(&s, &mut t, RedOp::Sum)?;
    if t.iter().any(|&v| v != n as f32) {
        return Err(nccl_rs::Error::InvalidArgument(
            "large all_reduce gave a wrong sum".into(),
        ));
    }
    comm.finalize()?;
    drop(comm);
    println!("done");
    Ok(())
}
