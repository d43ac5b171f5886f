//! Throughput of the shared-memory transport (ignored tests, run by hand on
//! a release build).

use super::net;
use nccl_rs::testing::shm::{pair, pattern};
use nccl_rs::transport::shm::{ShmNet, ShmOptions};
use nccl_rs::transport::{RecvComm, SendComm};
use std::time::Instant;

/// Prints best / median / mean GB/s of per-message `times`.
fn report(what: &str, size: usize, times: &mut [f64]) {
    let total: f64 = times.iter().sum();
    times.sort_by(f64::total_cmp);
    let gbs = |t: f64| size as f64 / t / 1e9;
    println!(
        "{what}: {size:>9} B x {:>5}: best {:6.2}  median {:6.2}  mean {:6.2} GB/s   (loadavg {})",
        times.len(),
        gbs(times[0]),
        gbs(times[times.len() / 2]),
        gbs(total / times.len() as f64),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}

/// Streams `iters` messages of `size` bytes between two threads and
/// reports the receive side's per-message times.
fn stream_bench(opts: &ShmOptions, size: usize, iters: usize) {
    let net = ShmNet::new(opts.clone()).unwrap();
    let (mut s, mut r) = pair(&net);
    let src = pattern(size, 1);
    let sender = std::thread::spawn(move || {
        for _ in 0..iters + 2 {
            // SAFETY: `src` outlives the request, completed below.
            let q = unsafe { s.isend(src.as_ptr(), size, 0, None) }
                .unwrap()
                .unwrap();
            while !s.test(q).unwrap() {}
        }
    });
    let mut dst = vec![0u8; size];
    let mut once = |r: &mut dyn RecvComm| {
        let t = Instant::now();
        // SAFETY: `dst` outlives the request, completed here.
        let q = unsafe { r.irecv(dst.as_mut_ptr(), size, 0, None) }
            .unwrap()
            .unwrap();
        while r.test(q).unwrap().is_none() {}
        t.elapsed().as_secs_f64()
    };
    once(r.as_mut());
    once(r.as_mut());
    let mut times: Vec<f64> = (0..iters).map(|_| once(r.as_mut())).collect();
    sender.join().unwrap();
    report(
        &format!("SHM buffsize {:>8} slots {:>3}", opts.buffsize, opts.slots),
        size,
        &mut times,
    );
}

/// Both ends driven by this one thread: the cost of the two copies alone,
/// free of scheduling effects.
fn one_thread_bench(size: usize, iters: usize) {
    let (mut s, mut r) = pair(&net());
    let src = pattern(size, 1);
    let mut dst = vec![0u8; size];
    let mut times: Vec<f64> = (0..iters + 2)
        .map(|_| {
            let t = Instant::now();
            send_recv(s.as_mut(), r.as_mut(), &src, &mut dst);
            t.elapsed().as_secs_f64()
        })
        .collect();
    report("SHM one thread, both ends", size, &mut times[2..]);
}

/// Posts a receive into `dst` and a send of `src`, and tests both to
/// completion.
fn send_recv(s: &mut dyn SendComm, r: &mut dyn RecvComm, src: &[u8], dst: &mut [u8]) {
    // SAFETY: both buffers outlive the requests, completed here.
    let rq = unsafe { r.irecv(dst.as_mut_ptr(), dst.len(), 0, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sq = unsafe { s.isend(src.as_ptr(), src.len(), 0, None) }
        .unwrap()
        .unwrap();
    let (mut sd, mut rd) = (false, false);
    while !(sd && rd) {
        sd = sd || s.test(sq).unwrap();
        rd = rd || r.test(rq).unwrap().is_some();
    }
}

fn memcpy_bench() {
    let src = pattern(64 << 20, 2);
    let mut dst = vec![0u8; 64 << 20];
    let mut times: Vec<f64> = (0..16)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
            t.elapsed().as_secs_f64()
        })
        .collect();
    report("memcpy (one thread)", 64 << 20, &mut times);
}

/// 64 MiB only, default options, next to memcpy:
/// `cargo test --release -p nccl-rs --test shm bench::bench_64mib -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_64mib() {
    stream_bench(&ShmOptions::default(), 64 << 20, 16);
    one_thread_bench(64 << 20, 16);
    memcpy_bench();
}

/// `cargo test --release -p nccl-rs --test shm bench::bench_throughput -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_throughput() {
    for (opts, sizes) in [
        (
            ShmOptions::default(),
            &[64usize << 20, 16 << 20, 1 << 20, 64 << 10][..],
        ),
        (
            ShmOptions {
                buffsize: 4 << 20,
                slots: 64,
                cma: false,
                ..ShmOptions::default()
            },
            &[64 << 20, 1 << 20, 64 << 10][..],
        ),
        (
            ShmOptions {
                buffsize: 1 << 20,
                slots: 16,
                cma: false,
                ..ShmOptions::default()
            },
            &[64 << 20, 1 << 20][..],
        ),
    ] {
        for &size in sizes {
            stream_bench(&opts, size, ((1usize << 30) / size).clamp(5, 2000));
        }
    }
    memcpy_bench();
    // Ping-pong latency, 8 bytes.
    let net = net();
    let (mut s1, mut r1) = pair(&net);
    let (mut s2, mut r2) = pair(&net);
    let n = 200_000;
    let echo = std::thread::spawn(move || {
        let mut b = [0u8; 8];
        for _ in 0..n {
            // SAFETY: `b` outlives each request, completed before reuse.
            let q = unsafe { r1.irecv(b.as_mut_ptr(), 8, 0, None) }
                .unwrap()
                .unwrap();
            while r1.test(q).unwrap().is_none() {}
            // SAFETY: as above.
            let q = unsafe { s2.isend(b.as_ptr(), 8, 0, None) }
                .unwrap()
                .unwrap();
            while !s2.test(q).unwrap() {}
        }
    });
    let mut b = [0u8; 8];
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: `b` outlives each request, completed before reuse.
        let q = unsafe { s1.isend(b.as_ptr(), 8, 0, None) }
            .unwrap()
            .unwrap();
        while !s1.test(q).unwrap() {}
        // SAFETY: as above.
        let q = unsafe { r2.irecv(b.as_mut_ptr(), 8, 0, None) }
            .unwrap()
            .unwrap();
        while r2.test(q).unwrap().is_none() {}
    }
    let dt = t.elapsed().as_secs_f64();
    echo.join().unwrap();
    println!(
        "SHM 8 B ping-pong: {:.2} us one-way",
        dt / n as f64 / 2.0 * 1e6
    );
}

/// One side of [`bench_exchange`]: `n` rounds of post a receive, send,
/// test both to completion.
fn exchange_side(s: &mut dyn SendComm, r: &mut dyn RecvComm, n: usize) -> f64 {
    let (src, mut dst) = ([7u8; 8], [0u8; 8]);
    let t = Instant::now();
    for _ in 0..n {
        send_recv(s, r, &src, &mut dst);
    }
    t.elapsed().as_secs_f64() / n as f64
}

/// As [`exchange_side`], on the eager path.
fn exchange_side_eager(s: &mut dyn SendComm, r: &mut dyn RecvComm, n: usize) -> f64 {
    let (src, mut dst) = ([7u8; 8], [0u8; 8]);
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: both buffers outlive the calls.
        while !unsafe { s.send_eager(src.as_ptr(), 8, 0) }.unwrap() {}
        // SAFETY: as above.
        while unsafe { r.recv_eager(dst.as_mut_ptr(), 8, 0) }
            .unwrap()
            .is_none()
        {}
    }
    t.elapsed().as_secs_f64() / n as f64
}

/// Symmetric 8-byte exchange between two threads, as a 2-rank tiny
/// collective does, through requests and on the eager path:
/// `cargo test --release -p nccl-rs --test shm bench::bench_exchange -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_exchange() {
    type Side = fn(&mut dyn SendComm, &mut dyn RecvComm, usize) -> f64;
    let net = net();
    let n = 1_000_000;
    for (what, side) in [
        ("requests", exchange_side as Side),
        ("eager", exchange_side_eager as Side),
    ] {
        let (mut s1, mut r1) = pair(&net);
        let (mut s2, mut r2) = pair(&net);
        let peer = std::thread::spawn(move || side(s2.as_mut(), r1.as_mut(), n));
        let t = side(s1.as_mut(), r2.as_mut(), n);
        peer.join().unwrap();
        println!(
            "SHM 8 B symmetric exchange, {what}: {:.1} ns per round",
            t * 1e9
        );
    }
}

/// Ring receives into a large destination with and without the streaming
/// hint ([`nccl_rs::transport::RecvHint`]), alternating message by message between
/// two threads (the sender copies from a buffer of the same size):
/// `cargo test --release -p nccl-rs --test shm bench::bench_stream_receive -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_stream_receive() {
    for size in [4usize << 20, 16 << 20, 64 << 20] {
        let net = ShmNet::new(ShmOptions {
            cma: false,
            ..ShmOptions::default()
        })
        .unwrap();
        let (mut s, mut r) = pair(&net);
        let iters = ((1usize << 30) / size).clamp(8, 64);
        let src = pattern(size, 1);
        let sender = std::thread::spawn(move || {
            for _ in 0..2 * iters + 2 {
                // SAFETY: `src` outlives the request, completed below.
                let q = unsafe { s.isend(src.as_ptr(), size, 0, None) }
                    .unwrap()
                    .unwrap();
                while !s.test(q).unwrap() {}
            }
        });
        let mut dst = vec![0u8; size];
        let start = dst.as_ptr() as usize;
        let (mut plain, mut streamed) = (Vec::new(), Vec::new());
        for i in 0..2 * iters + 2 {
            let stream = i % 2 == 1;
            r.hint_recv(nccl_rs::transport::RecvHint {
                stream: if stream {
                    (start, start + size)
                } else {
                    (0, 0)
                },
            });
            let t = Instant::now();
            // SAFETY: `dst` outlives the request, completed here.
            let q = unsafe { r.irecv(dst.as_mut_ptr(), size, 0, None) }
                .unwrap()
                .unwrap();
            while r.test(q).unwrap().is_none() {}
            let dt = t.elapsed().as_secs_f64();
            if i >= 2 {
                if stream { &mut streamed } else { &mut plain }.push(dt);
            }
        }
        sender.join().unwrap();
        report("ring receive, plain stores    ", size, &mut plain);
        report("ring receive, streaming stores", size, &mut streamed);
    }
}
