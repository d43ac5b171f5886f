//! The shared-memory transport (`nccl_rs::transport::shm`) through its
//! public API: the eager path, lending received bytes, two processes, and
//! throughput benchmarks (ignored). The tests that need the transport's
//! internals are unit tests in `src/transport/shm/tests/`.

use nccl_rs::transport::shm::{ShmNet, ShmOptions};
use nccl_rs::transport::{Net, NetResult, RecvComm, Request, SendComm};
use std::time::{Duration, Instant};

mod bench;
mod eager;
mod lend;
mod process;

const DEADLINE: Duration = Duration::from_secs(20);
const CHILD_ENV: &str = "NCCL_RS_SHM_TEST_CHILD";
const DIR_ENV: &str = "NCCL_RS_SHM_TEST_DIR";

fn net() -> ShmNet {
    ShmNet::new(ShmOptions::default()).unwrap()
}

/// Polls `f` until it yields, failing after [`DEADLINE`].
fn poll<T>(what: &str, mut f: impl FnMut() -> NetResult<Option<T>>) -> NetResult<T> {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn isend(s: &mut dyn SendComm, buf: &[u8], tag: u32) -> Request {
    // SAFETY: every caller keeps `buf` alive and unmodified until the
    // request is tested complete (or the comm is dropped).
    poll("isend slot", || unsafe {
        s.isend(buf.as_ptr(), buf.len(), tag, None)
    })
    .unwrap()
}

fn irecv(r: &mut dyn RecvComm, buf: &mut [u8], tag: u32) -> Request {
    // SAFETY: every caller keeps `buf` alive and untouched until the
    // request is tested complete (or the comm is dropped).
    poll("irecv slot", || unsafe {
        r.irecv(buf.as_mut_ptr(), buf.len(), tag, None)
    })
    .unwrap()
}

/// A connected pair over `net`.
fn pair(net: &ShmNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let mut l = net.listen().unwrap();
    let mut c = net.connect(l.handle()).unwrap();
    let s = poll("connect", || c.poll_connect()).unwrap();
    let r = poll("accept", || l.accept()).unwrap();
    (s, r)
}

/// Sends `bufs` one at a time, each to completion.
fn send_all(s: &mut dyn SendComm, bufs: &[Vec<u8>], tag: u32) {
    for b in bufs {
        let q = isend(s, b, tag);
        poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
    }
}

/// Receives into buffers of `sizes` and checks against `pattern(size, seed + i)`.
fn recv_check(r: &mut dyn RecvComm, sizes: &[usize], seed: u64, tag: u32) {
    for (i, &n) in sizes.iter().enumerate() {
        let mut buf = vec![0u8; n];
        let q = irecv(r, &mut buf, tag);
        let got = poll("recv", || r.test(q)).unwrap();
        assert_eq!(got, n, "size of message {i}");
        assert!(
            buf == pattern(n, seed + i as u64),
            "content of message {i} ({n} bytes)"
        );
    }
}
