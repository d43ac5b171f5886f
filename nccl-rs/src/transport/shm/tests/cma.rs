//! Tests of the single-copy path (`process_vm_readv`): path selection,
//! odd sizes around the threshold, many messages in flight, the fallback
//! when the probe fails, and peers that go away mid-transfer. The
//! cross-process tests ([`super::process`]) run the default (ring) path.

use super::{
    exchange, irecv, isend, pair, pattern, patterns, poll, recv_check, ring_net, send_windowed,
};
use crate::transport::shm::connect::{ShmConnector, ShmListener};
use crate::transport::shm::segment::Geometry;
use crate::transport::shm::*;
use nccl_net::{NetError, SendComm};
use std::sync::atomic::Ordering;

fn cma_net(buffsize: usize, slots: usize, min: usize) -> ShmNet {
    ShmNet::new(ShmOptions {
        buffsize,
        slots,
        cma: true,
        cma_min_bytes: min,
        ..ShmOptions::default()
    })
    .unwrap()
}

/// Single copy from `min` bytes, split messages on.
fn opts(min: usize) -> cma::CmaOpts {
    cma::CmaOpts { min, split: true }
}

/// Default options with single copy on (as `NCCL_RS_SHM_SINGLE_COPY=1` sets it).
pub(super) fn cma_default() -> ShmNet {
    ShmNet::new(ShmOptions {
        cma: true,
        ..ShmOptions::default()
    })
    .unwrap()
}

/// Polls a send that can only complete through the ring `polls` times and
/// says whether it completed.
fn completes_alone(s: &mut dyn SendComm, q: nccl_net::Request, polls: usize) -> bool {
    (0..polls).any(|_| s.test(q).unwrap())
}

#[test]
fn single_copy_send_completes_only_when_read() {
    let data = pattern(1 << 20, 11);
    // Single copy: the sender's buffer is the only copy, so the send
    // cannot complete before the receiver has read it.
    let (mut s, mut r) = pair(&cma_default());
    let q = isend(s.as_mut(), &data, 5);
    assert!(!completes_alone(s.as_mut(), q, 1000));
    let mut buf = vec![0u8; 1 << 20];
    let rq = irecv(r.as_mut(), &mut buf, 5);
    assert_eq!(poll("recv", || r.test(rq)).unwrap(), 1 << 20);
    poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
    assert!(buf == data);
    // Through the ring (single copy off, the default): 1 MiB fits in the 4 MiB ring, so
    // the send completes with nobody receiving.
    let (mut s, mut r) = pair(&ring_net());
    let q = isend(s.as_mut(), &data, 5);
    assert!(completes_alone(s.as_mut(), q, 1000));
    recv_check(r.as_mut(), &[1 << 20], 11, 5);
}

const ODD_SIZES: &[usize] = &[
    0,
    1,
    47,
    48,
    49,
    64,
    65,
    4095,
    65_535,
    65_536,
    65_537,
    (1 << 20) + 3,
    (5 << 20) + 7,
    100_001,
    3,
    (9 << 20) + 1,
    64 << 10,
];

#[test]
fn odd_sizes_in_flight_together() {
    // Default threshold (16 KiB), threshold 0 (everything past the inline
    // line goes single-copy), and a tiny ring mixing both kinds of frames.
    for net in [
        cma_default(),
        cma_net(4 << 20, 8, 0),
        cma_net(4096, 4, 1000),
    ] {
        let (mut s, mut r) = pair(&net);
        exchange(s.as_mut(), r.as_mut(), ODD_SIZES, 21);
        for (i, &n) in ODD_SIZES.iter().enumerate() {
            exchange(s.as_mut(), r.as_mut(), &[n], 40 + i as u64);
        }
    }
}

#[test]
fn many_in_flight_two_threads() {
    let net = cma_net(4096, 4, 1000);
    let (mut s, mut r) = pair(&net);
    let sizes: Vec<usize> = pattern(1200, 31)
        .chunks(3)
        .map(|c| (usize::from(c[0]) << 16 | usize::from(c[1]) << 8 | usize::from(c[2])) % 300_000)
        .collect();
    let bufs = patterns(&sizes, 2000);
    let sender = std::thread::spawn(move || send_windowed(s.as_mut(), &bufs, 4, MAX_REQUESTS));
    // Keep many receives posted as well, completing in order.
    let mut got: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let mut posted = std::collections::VecDeque::new();
    let mut next = 0;
    let mut bufs = got.iter_mut();
    while next < sizes.len() || !posted.is_empty() {
        while next < sizes.len() && posted.len() < MAX_REQUESTS {
            posted.push_back((next, irecv(r.as_mut(), bufs.next().unwrap(), 4)));
            next += 1;
        }
        let (i, q) = *posted.front().unwrap();
        let n = poll("recv", || r.test(q)).unwrap();
        assert_eq!(n, sizes[i], "size of message {i}");
        posted.pop_front();
    }
    sender.join().unwrap();
    for (i, g) in got.iter().enumerate() {
        assert!(*g == pattern(sizes[i], 2000 + i as u64), "message {i}");
    }
}

#[test]
fn failed_probe_falls_back_to_the_ring() {
    let geom = Geometry::new(4 << 20, 8).unwrap();
    let wrong = 0u64;
    // An unmapped address (EFAULT) and one holding the wrong value.
    for bogus in [8u64, std::ptr::addr_of!(wrong) as u64] {
        let mut l = ShmListener::new(geom, Some(opts(1000)), true).unwrap();
        let mut c = ShmConnector::connect(l.handle(), Some(opts(1000))).unwrap();
        let hdr = l.header().unwrap();
        hdr.send.0.cma_probe.store(bogus, Ordering::Relaxed);
        let mut r = poll("accept", || l.accept()).unwrap();
        let mut s = poll("connect", || c.poll_connect()).unwrap();
        let data = pattern(1 << 20, 12);
        let q = isend(s.as_mut(), &data, 1);
        assert!(
            completes_alone(s.as_mut(), q, 1000),
            "copied through the ring"
        );
        recv_check(r.as_mut(), &[1 << 20], 12, 1);
        exchange(s.as_mut(), r.as_mut(), ODD_SIZES, 77);
    }
}

#[test]
fn truncated_single_copy_message() {
    let (mut s, mut r) = pair(&cma_default());
    let data = pattern(200_000, 1);
    let _q = isend(s.as_mut(), &data, 0);
    let mut small = vec![0u8; 100_000];
    let q = irecv(r.as_mut(), &mut small, 0);
    assert!(matches!(
        poll("truncation", || r.test(q)),
        Err(NetError::Truncated {
            posted: 100_000,
            got: 200_000
        })
    ));
    assert!(small.iter().all(|&b| b == 0), "nothing written");
}

#[test]
fn sender_dropped_before_the_read_gives_closed() {
    let (mut s, mut r) = pair(&cma_default());
    let data = pattern(1 << 20, 2);
    let _q = isend(s.as_mut(), &data, 0);
    drop(s);
    let mut buf = vec![0u8; 1 << 20];
    let q = irecv(r.as_mut(), &mut buf, 0);
    match poll("closed", || r.test(q)) {
        Err(NetError::Closed(m)) => assert!(m.contains("shm peer pid"), "{m}"),
        other => panic!("expected Closed, got {other:?}"),
    }
}

#[test]
fn receiver_dropped_before_the_read_gives_closed() {
    let (mut s, r) = pair(&cma_default());
    let data = pattern(1 << 20, 3);
    let q = isend(s.as_mut(), &data, 0);
    assert!(!s.test(q).unwrap());
    drop(r);
    assert!(matches!(
        poll("closed", || Ok(s.test(q)?.then_some(()))),
        Err(NetError::Closed(_))
    ));
}

#[test]
fn receiver_without_single_copy_gets_the_ring() {
    // The receiver has single copy off, the sender on: the receiver's
    // verdict wins.
    let geom = Geometry::new(4 << 20, 8).unwrap();
    let mut l = ShmListener::new(geom, None, true).unwrap();
    let mut c = ShmConnector::connect(l.handle(), Some(opts(1000))).unwrap();
    let mut r = poll("accept", || l.accept()).unwrap();
    let mut s = poll("connect", || c.poll_connect()).unwrap();
    let data = pattern(4000, 4);
    let q = isend(s.as_mut(), &data, 0);
    assert!(completes_alone(s.as_mut(), q, 10), "ring path when told no");
    recv_check(r.as_mut(), &[4000], 4, 0);
}

/// Reads and writes of this process by cross-memory attach at the slow
/// distances of `rep movsb` go through the bounce buffer, and at others not;
/// every byte arrives either way, and nothing around the destination moves.
#[test]
fn transfers_at_slow_distances_bounce_and_stay_exact() {
    let pid = std::process::id() as i32;
    let src: Vec<u8> = (0..400_000u32).map(|i| (i * 17 + 5) as u8).collect();
    for d in [0usize, 4, 12, 63, 64, 2000] {
        for len in [1usize, 4095, 4096, 200_000, 300_001] {
            for write in [false, true] {
                let mut dst = vec![0x5Au8; 400_000 + 8192];
                let want = (src.as_ptr() as usize + d) % 4096;
                let at = (want + 4096 - dst.as_ptr() as usize % 4096) % 4096;
                let before = cma::BOUNCED.get();
                // SAFETY: `dst[at..at + len]` and `src[..len]` are in bounds
                // (at < 4096), distinct, and not otherwise used meanwhile.
                let r = unsafe {
                    let to = dst.as_mut_ptr().add(at);
                    match write {
                        false => cma::read(pid, to, src.as_ptr() as u64, len),
                        true => cma::write(pid, src.as_ptr(), to as u64, len),
                    }
                };
                r.unwrap();
                let what = format!("distance {d}, {len} bytes, write {write}");
                assert_eq!(&dst[at..at + len], &src[..len], "{what}");
                assert!(dst[..at].iter().all(|&b| b == 0x5A), "{what}: before");
                assert!(dst[at + len..].iter().all(|&b| b == 0x5A), "{what}: after");
                let bounced = cma::BOUNCED.get() > before;
                let slow = (1..64).contains(&d) && len >= 4096;
                assert_eq!(bounced, slow, "{what}: bounced {bounced}");
            }
        }
    }
}

/// Messages that may go single copy take the ring up to the plan's
/// `buffered_max`, with the stores it says; larger ones go single copy.
#[test]
fn messages_up_to_the_plans_limit_take_the_ring() {
    use crate::transport::shm::send::STREAMED_IN;
    let net = ShmNet::new(ShmOptions {
        cma: true,
        ..ShmOptions::default()
    })
    .unwrap();
    for streaming_stores in [false, true] {
        let (mut s, mut r) = pair(&net);
        s.hint_copy(nccl_net::CopyHint {
            single_copy: true,
            buffered_max: 64 << 10,
            streaming_stores,
            ..nccl_net::CopyHint::default()
        });
        // (length, through the ring)
        for (i, &(len, ring)) in [(32 << 10, true), (64 << 10, true), (70_000, false)]
            .iter()
            .enumerate()
        {
            let data = pattern(len, 40 + i as u64);
            let before = STREAMED_IN.get();
            let q = isend(s.as_mut(), &data, 3);
            // Through the ring a send completes with nobody receiving.
            let alone = completes_alone(s.as_mut(), q, 1);
            let mut buf = vec![0u8; len];
            let rq = irecv(r.as_mut(), &mut buf, 3);
            assert_eq!(poll("recv", || r.test(rq)).unwrap(), len);
            if !alone {
                poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
            }
            assert!(buf == data, "message {i}");
            assert_eq!(alone, ring, "message {i} ({len} bytes)");
            let streamed = STREAMED_IN.get() - before;
            let want = if ring && streaming_stores { len } else { 0 };
            assert_eq!(streamed, want, "message {i}, streaming {streaming_stores}");
        }
    }
}
