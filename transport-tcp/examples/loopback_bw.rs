//! Loopback bandwidth of the TCP transport: one sender thread, one receiver
//! thread, `ITERS` messages of `SIZE_MIB` MiB each.
//!
//! `cargo run --release -p transport-tcp --example loopback_bw -- [SIZE_MIB] [ITERS] [SOCKET_BUF_BYTES] [YIELD] [NSOCKS] [NTHREADS] [SPLICE_MIN]`
//!
//! `NSOCKS` sockets per connection (default 1), `NTHREADS` helper threads
//! per comm (default 1: none), messages from `SPLICE_MIN` bytes spliced
//! (default as `TcpOptions`; 0: none), however large (the transport's
//! default stops at `default_splice_max_bytes()`).
//!
//! With `YIELD` = 1 the polling threads call `yield_now` between unfinished
//! polls, which helps on a machine with fewer free cores than pollers.

use nccl_net::Net;
use std::time::{Duration, Instant};
use transport_tcp::{TcpNet, TcpOptions};

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("numeric argument"));
    let size = args.next().unwrap_or(64) << 20;
    let iters = args.next().unwrap_or(10);
    let buf = args
        .next()
        .unwrap_or(TcpOptions::default().socket_buf_bytes);
    let yield_now = args.next().unwrap_or(0) != 0;
    let nsocks = args.next().unwrap_or(1);
    let nthreads = args.next().unwrap_or(1);
    let splice_min = args
        .next()
        .unwrap_or(TcpOptions::default().splice_min_bytes);
    let opts = TcpOptions {
        socket_buf_bytes: buf,
        nsocks,
        nthreads,
        splice_min_bytes: splice_min,
        splice_max_bytes: usize::MAX,
        ..TcpOptions::default()
    };
    let net = TcpNet::with_local_ip("127.0.0.1".parse().unwrap(), opts).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut listener = net.listen().unwrap();
    let mut connector = net.connect(listener.handle()).unwrap();
    let (mut s, mut r) = (None, None);
    while s.is_none() || r.is_none() {
        assert!(Instant::now() < deadline, "handshake timed out");
        if s.is_none() {
            s = connector.poll_connect().unwrap();
        }
        if r.is_none() {
            r = listener.accept().unwrap();
        }
    }
    let (mut s, mut r) = (s.unwrap(), r.unwrap());
    let sender = std::thread::spawn(move || {
        let src = vec![7u8; size];
        for _ in 0..iters {
            // SAFETY: `src` outlives the request, tested to completion below.
            let req = unsafe { s.isend(src.as_ptr(), size, 0, None) }
                .unwrap()
                .unwrap();
            while !s.test(req).unwrap() {
                assert!(Instant::now() < deadline, "send timed out");
                if yield_now {
                    std::thread::yield_now();
                }
            }
        }
    });
    let mut dst = vec![0u8; size];
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: `dst` outlives the request, tested to completion below.
        let req = unsafe { r.irecv(dst.as_mut_ptr(), size, 0, None) }
            .unwrap()
            .unwrap();
        while r.test(req).unwrap().is_none() {
            assert!(Instant::now() < deadline, "recv timed out");
            if yield_now {
                std::thread::yield_now();
            }
        }
    }
    let dt = t.elapsed().as_secs_f64();
    sender.join().unwrap();
    assert!(dst.iter().all(|&b| b == 7));
    println!(
        "{iters} x {} MiB, socket buffers {buf} B, {nsocks} sockets, {nthreads} threads, splice from {splice_min} B: {:.3} s, {:.2} GB/s ({:.1} Gbit/s)",
        size >> 20,
        dt,
        (iters * size) as f64 / dt / 1e9,
        (iters * size) as f64 * 8.0 / dt / 1e9
    );
}
