//! Helpers of the shared-memory transport's tests, unit and integration:
//! polling with a deadline, deterministic payloads, posting requests and
//! connecting pairs through the [`Net`] seam.

use crate::transport::{Net, NetResult, RecvComm, Request, SendComm};
use std::time::{Duration, Instant};

/// How long [`poll`] waits for anything.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `f` until it yields, failing after [`DEADLINE`].
///
/// # Panics
/// If `f` has not yielded by the deadline.
pub fn poll<T>(what: &str, mut f: impl FnMut() -> NetResult<Option<T>>) -> NetResult<T> {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// `len` pseudo-random bytes drawn from `seed` (xorshift).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
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

/// Message `i` of `sizes` is `pattern(sizes[i], seed + i)`, as
/// [`recv_check`] expects.
pub fn patterns(sizes: &[usize], seed: u64) -> Vec<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, seed + i as u64))
        .collect()
}

/// Posts a send of `buf`, polling for a free request slot. The caller must
/// keep `buf` alive and unmodified until the request is tested complete (or
/// the comm is dropped).
pub fn isend(s: &mut dyn SendComm, buf: &[u8], tag: u32) -> Request {
    // SAFETY: every caller keeps `buf` alive and unmodified until the
    // request is tested complete (or the comm is dropped).
    poll("isend slot", || unsafe {
        s.isend(buf.as_ptr(), buf.len(), tag, None)
    })
    .unwrap()
}

/// Posts a receive into `buf`, polling for a free request slot. The caller
/// must keep `buf` alive and untouched until the request is tested complete
/// (or the comm is dropped).
pub fn irecv(r: &mut dyn RecvComm, buf: &mut [u8], tag: u32) -> Request {
    // SAFETY: every caller keeps `buf` alive and untouched until the
    // request is tested complete (or the comm is dropped).
    poll("irecv slot", || unsafe {
        r.irecv(buf.as_mut_ptr(), buf.len(), tag, None)
    })
    .unwrap()
}

/// A connected pair over `net`, in this thread.
pub fn pair(net: &dyn Net) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let mut l = net.listen().unwrap();
    let mut c = net.connect(l.handle()).unwrap();
    let s = poll("connect", || c.poll_connect()).unwrap();
    let r = poll("accept", || l.accept()).unwrap();
    (s, r)
}

/// Sends `bufs` in order, waiting for each (any thread).
pub fn send_all(s: &mut dyn SendComm, bufs: &[Vec<u8>], tag: u32) {
    for b in bufs {
        let q = isend(s, b, tag);
        poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
    }
}

/// Receives into buffers of `sizes` and checks against `pattern(size, seed + i)`.
pub fn recv_check(r: &mut dyn RecvComm, sizes: &[usize], seed: u64, tag: u32) {
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
