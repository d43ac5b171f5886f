//! Tests of the shared-memory transport in one process (one or two
//! threads), and the helpers the other test modules share.

use super::*;
use crate::testing::shm::{
    irecv, isend, pair, pattern, patterns, poll, recv_check, send_all, DEADLINE,
};
use nccl_net::{NetError, RecvComm, Request, SendComm, MAX_HANDLE_BYTES};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

mod cma;
mod process;
mod split;
mod stream;

pub(super) fn net() -> ShmNet {
    ShmNet::new(ShmOptions::default()).unwrap()
}

/// Default geometry, single copy off: every message goes through the ring.
pub(super) fn ring_net() -> ShmNet {
    ShmNet::new(ShmOptions {
        cma: false,
        ..ShmOptions::default()
    })
    .unwrap()
}

fn shm_path(name: &str) -> PathBuf {
    Path::new("/dev/shm").join(name)
}

fn name_of(handle: &[u8]) -> String {
    handle::ShmHandle::decode(handle).unwrap().name
}

/// Posts every message in `sizes` on both sides at once (as far as the
/// request limit allows) and drives both from this thread.
pub(super) fn exchange(s: &mut dyn SendComm, r: &mut dyn RecvComm, sizes: &[usize], seed: u64) {
    let sends = patterns(sizes, seed);
    let mut recvs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xAA; n + 3]).collect();
    let mut sreq = Vec::new();
    let mut rreq = Vec::new();
    for (i, buf) in recvs.iter_mut().enumerate() {
        rreq.push(Some(irecv(r, buf, i as u32)));
    }
    for (i, buf) in sends.iter().enumerate() {
        sreq.push(Some(isend(s, buf, i as u32)));
    }
    let mut got = vec![0usize; sizes.len()];
    let end = Instant::now() + DEADLINE;
    // Test in reverse order too: completion is in order, reporting is not.
    while sreq.iter().chain(rreq.iter()).any(Option::is_some) {
        assert!(Instant::now() < end, "exchange timed out");
        for i in (0..sizes.len()).rev() {
            if let Some(q) = sreq[i] {
                if s.test(q).unwrap() {
                    sreq[i] = None;
                }
            }
            if let Some(q) = rreq[i] {
                if let Some(n) = r.test(q).unwrap() {
                    got[i] = n;
                    rreq[i] = None;
                }
            }
        }
    }
    for (i, &n) in sizes.iter().enumerate() {
        assert_eq!(got[i], n, "size of message {i}");
        assert!(
            recvs[i][..n] == sends[i][..],
            "content of message {i} ({n} bytes)"
        );
        assert_eq!(
            &recvs[i][n..],
            &[0xAA; 3],
            "bytes past message {i} untouched"
        );
    }
}

/// Sends `bufs` in order with up to `window` in flight, then waits for all.
pub(super) fn send_windowed(s: &mut dyn SendComm, bufs: &[Vec<u8>], tag: u32, window: usize) {
    let mut pending = std::collections::VecDeque::new();
    for b in bufs {
        pending.push_back(isend(s, b, tag));
        while pending.len() >= window {
            let q = *pending.front().unwrap();
            if s.test(q).unwrap() {
                pending.pop_front();
            } else {
                std::thread::yield_now();
            }
        }
    }
    for q in pending {
        poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
    }
}

#[test]
fn handshake_and_unlink() {
    let net = net();
    assert_eq!(net.properties().name, "SHM");
    let mut l = net.listen().unwrap();
    assert!(l.handle().len() <= MAX_HANDLE_BYTES);
    let name = name_of(l.handle());
    assert!(
        name.starts_with(&format!("nccl-rs-{}-", std::process::id())),
        "{name}"
    );
    assert!(shm_path(&name).exists());
    assert!(l.accept().unwrap().is_none(), "nobody connected yet");
    // The bootstrap pads handles: padding must not matter.
    let mut padded = l.handle().to_vec();
    padded.resize(MAX_HANDLE_BYTES, 0);
    let mut c = net.connect(&padded).unwrap();
    let mut s = poll("connect", || c.poll_connect()).unwrap();
    let mut r = poll("accept", || l.accept()).unwrap();
    assert!(
        !shm_path(&name).exists(),
        "segment name survives the connection"
    );
    assert!(c.poll_connect().is_err() && l.accept().is_err());
    exchange(s.as_mut(), r.as_mut(), &[5], 1);
}

#[test]
fn unconnected_listener_unlinks_on_drop() {
    let l = net().listen().unwrap();
    let name = name_of(l.handle());
    assert!(shm_path(&name).exists());
    drop(l);
    assert!(!shm_path(&name).exists());
}

#[test]
fn wrong_nonce_and_second_connector_are_refused() {
    let net = net();
    let mut l = net.listen().unwrap();
    let mut bad = l.handle().to_vec();
    bad[20] ^= 0x40; // inside the nonce
    match net.connect(&bad) {
        Err(NetError::BadHandle(m)) => assert!(m.contains("nonce"), "{m}"),
        other => panic!("wrong nonce accepted: {:?}", other.map(|_| ())),
    }
    let mut bad = l.handle().to_vec();
    bad[8] ^= 1; // size
    assert!(matches!(net.connect(&bad), Err(NetError::BadHandle(_))));
    assert!(
        l.accept().unwrap().is_none(),
        "a refused connector must not connect"
    );
    // The genuine handle still works, once.
    let handle = l.handle().to_vec();
    let mut c = net.connect(&handle).unwrap();
    let mut s = poll("connect", || c.poll_connect()).unwrap();
    let mut r = poll("accept", || l.accept()).unwrap();
    assert!(matches!(net.connect(&handle), Err(NetError::BadHandle(_))));
    exchange(s.as_mut(), r.as_mut(), &[0, 100], 2);
}

const SIZES: &[usize] = &[0, 1, 7, 48, 49, 63, 64, 65, 4095, 1 << 20, 64 << 20];

#[test]
fn sizes_one_at_a_time_both_directions() {
    let net = net();
    let (mut s1, mut r1) = pair(&net);
    let (mut s2, mut r2) = pair(&net);
    for (i, &n) in SIZES.iter().enumerate() {
        exchange(s1.as_mut(), r1.as_mut(), &[n], 10 + i as u64);
        exchange(s2.as_mut(), r2.as_mut(), &[n], 100 + i as u64);
    }
}

#[test]
fn many_in_flight_larger_than_ring() {
    // A 64 KiB ring: most of these exceed it.
    let net = ShmNet::new(ShmOptions {
        buffsize: 64 << 10,
        slots: 8,
        cma: false,
        ..ShmOptions::default()
    })
    .unwrap();
    let (mut s, mut r) = pair(&net);
    let sizes = [0, 1, 7, 4095, 1 << 20, 0, 65 << 10, 48, 3 << 20, 100_000, 1];
    exchange(s.as_mut(), r.as_mut(), &sizes, 7);
    // Default ring (4 MiB): messages of more than the whole ring, in flight
    // together with small ones.
    let (mut s, mut r) = pair(&self::net());
    exchange(
        s.as_mut(),
        r.as_mut(),
        &[9 << 20, 3, 5 << 20, 0, 4 << 20, 4095],
        8,
    );
}

#[test]
fn request_limit_and_unknown_requests() {
    let (mut s, mut r) = pair(&net());
    let bufs: Vec<Vec<u8>> = (0..MAX_REQUESTS + 1)
        .map(|i| pattern(10, i as u64))
        .collect();
    let mut reqs = Vec::new();
    for b in &bufs[..MAX_REQUESTS] {
        // SAFETY: `bufs` outlives the requests, all tested below.
        reqs.push(
            unsafe { s.isend(b.as_ptr(), b.len(), 0, None) }
                .unwrap()
                .unwrap(),
        );
    }
    // SAFETY: refused, nothing is kept.
    assert!(unsafe { s.isend(bufs[0].as_ptr(), 10, 0, None) }
        .unwrap()
        .is_none());
    assert!(s.test(Request(9999)).is_err());
    for q in reqs {
        assert!(s.test(q).unwrap(), "small sends complete into the ring");
        assert!(s.test(q).is_err(), "reported twice");
    }
    recv_check(r.as_mut(), &[10; MAX_REQUESTS], 0, 0);
    assert!(r.test(Request(12345)).is_err());
}

/// 4 slots of 1 KiB, single copy off: constant wrapping, frames split
/// across slots.
pub(super) fn small_ring_net() -> ShmNet {
    ShmNet::new(ShmOptions {
        buffsize: 4096,
        slots: 4,
        cma: false,
        ..ShmOptions::default()
    })
    .unwrap()
}

/// `n` message sizes below 9000 bytes drawn from `seed`.
pub(super) fn random_sizes(n: usize, seed: u64) -> Vec<usize> {
    pattern(2 * n, seed)
        .chunks(2)
        .map(|c| (usize::from(c[0]) << 8 | usize::from(c[1])) % 9000)
        .collect()
}

#[test]
fn small_ring_two_threads_random_sizes() {
    let (mut s, mut r) = pair(&small_ring_net());
    let sizes = random_sizes(1500, 99);
    let bufs = patterns(&sizes, 1000);
    // Keep several in flight.
    let sender = std::thread::spawn(move || send_windowed(s.as_mut(), &bufs, 3, 5));
    recv_check(r.as_mut(), &sizes, 1000, 3);
    sender.join().unwrap();
}

#[test]
fn big_stream_two_threads() {
    let (mut s, mut r) = pair(&net());
    let sizes = [64 << 20, 1, 64 << 20, 12345, 0, 5 << 20];
    let bufs = patterns(&sizes, 500);
    let sender = std::thread::spawn(move || send_all(s.as_mut(), &bufs, 9));
    recv_check(r.as_mut(), &sizes, 500, 9);
    sender.join().unwrap();
}

#[test]
fn tag_mismatch() {
    let (mut s, mut r) = pair(&net());
    let data = pattern(100, 1);
    let q = isend(s.as_mut(), &data, 1);
    assert!(s.test(q).unwrap());
    let mut buf = vec![0u8; 100];
    let q = irecv(r.as_mut(), &mut buf, 2);
    match r.test(q) {
        Err(NetError::TagMismatch {
            expected: 2,
            got: 1,
        }) => {}
        other => panic!("expected a tag mismatch, got {other:?}"),
    }
    // The fault sticks.
    assert!(matches!(r.test(q), Err(NetError::TagMismatch { .. })));
    // SAFETY: refused, nothing is kept.
    assert!(unsafe { r.irecv(buf.as_mut_ptr(), 1, 1, None) }.is_err());
}

#[test]
fn truncation() {
    let (mut s, mut r) = pair(&net());
    for (len, posted) in [(100, 50), (1 << 20, (1 << 20) - 1), (49, 48)] {
        let data = pattern(len, 2);
        let q = isend(s.as_mut(), &data, 0);
        let mut buf = vec![0u8; posted];
        let rq = irecv(r.as_mut(), &mut buf, 0);
        match r.test(rq) {
            Err(NetError::Truncated { posted: p, got }) => assert_eq!((p, got), (posted, len)),
            other => panic!("expected truncation, got {other:?}"),
        }
        let _ = s.test(q);
        (s, r) = pair(&net());
    }
}

#[test]
fn dropped_sender_gives_closed_after_draining() {
    let (mut s, mut r) = pair(&ring_net());
    let data = pattern(3 << 20, 3);
    let q = isend(s.as_mut(), &data, 0);
    assert!(s.test(q).unwrap(), "3 MiB fits in the 4 MiB ring");
    drop(s);
    // What was sent before the drop still arrives.
    recv_check(r.as_mut(), &[3 << 20], 3, 0);
    let mut buf = vec![0u8; 10];
    let q = irecv(r.as_mut(), &mut buf, 0);
    match poll("closed", || r.test(q)) {
        Err(NetError::Closed(m)) => assert!(
            m.contains(&format!("shm peer pid {}", std::process::id())),
            "{m}"
        ),
        other => panic!("expected Closed, got {other:?}"),
    }
}

#[test]
fn dropped_receiver_gives_closed() {
    let (mut s, r) = pair(&net());
    drop(r);
    let data = pattern(9 << 20, 4); // more than the ring: must wait for room
    let q = isend(s.as_mut(), &data, 0);
    assert!(matches!(
        poll("closed", || Ok(s.test(q)?.then_some(()))),
        Err(NetError::Closed(_))
    ));
}

#[test]
fn dropped_listener_gives_closed() {
    let net = net();
    let l = net.listen().unwrap();
    let mut c = net.connect(l.handle()).unwrap();
    let mut s = poll("connect", || c.poll_connect()).unwrap();
    drop(l);
    let data = pattern(5 << 20, 5);
    let q = isend(s.as_mut(), &data, 0);
    assert!(matches!(
        poll("closed", || Ok(s.test(q)?.then_some(()))),
        Err(NetError::Closed(_))
    ));
    // And a connect after the listener is gone fails.
    let l = net.listen().unwrap();
    let h = l.handle().to_vec();
    drop(l);
    assert!(net.connect(&h).is_err());
}

#[test]
fn sweep_removes_segments_of_dead_processes() {
    use std::os::unix::fs::FileExt;
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let tag = format!(
        "{:x}",
        pattern(8, u64::from(dead))
            .iter()
            .fold(0u64, |a, &b| a << 8 | u64::from(b))
    );
    let stale = shm_path(&format!("nccl-rs-{dead}-{tag}"));
    let other_ns = shm_path(&format!("nccl-rs-{dead}-{tag}ff"));
    let live = shm_path(&format!("nccl-rs-1-{tag}"));
    let off = (std::mem::offset_of!(segment::Header, recv)
        + std::mem::offset_of!(segment::Side, pidns)) as u64;
    for (p, ns) in [
        (&stale, peer::own_pidns()),
        (&other_ns, peer::own_pidns() ^ 1),
        (&live, peer::own_pidns()),
    ] {
        let f = std::fs::File::create(p).unwrap();
        f.set_len(8192).unwrap();
        f.write_all_at(&ns.to_le_bytes(), off).unwrap();
    }
    let _net = net();
    let (a, b, c) = (stale.exists(), other_ns.exists(), live.exists());
    let _ = std::fs::remove_file(&other_ns);
    let _ = std::fs::remove_file(&live);
    let _ = std::fs::remove_file(&stale);
    assert!(!a, "segment of dead pid {dead} not swept");
    assert!(b, "segment from another pid namespace swept");
    assert!(c, "segment of a live process swept");
}
