//! The verbs transport over a real RDMA device, both ends in this process:
//! handshake, exact payloads from 0 bytes to 64 MiB, bounce and zero-copy
//! paths, several QPs per connection, many requests in flight, tag
//! mismatch, truncation and peer close.
//!
//! These tests need a device, so they are `#[ignore]`d. Run them with
//! `VERBS_TEST_DEVICE=rxe0 cargo test -p transport-verbs -- --ignored`
//! (or `NCCL_IB_HCA`); `scripts/rxe/run.sh` does so inside a QEMU guest
//! with soft-RoCE. Every poll loop runs under a deadline.

use nccl_net::{MemHandle, Net, NetError, RecvComm, Request, SendComm};
use std::time::{Duration, Instant};
use transport_verbs::{VerbsError, VerbsNet, VerbsOptions, MAX_REQUESTS};

/// Generous: soft-RoCE under QEMU TCG moves some tens of MB/s.
const DEADLINE: Duration = Duration::from_secs(120);

fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NCCL_RS_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(false)
        .with_test_writer()
        .try_init();
}

fn options(qps: usize) -> VerbsOptions {
    init_logging();
    let dev = std::env::var("VERBS_TEST_DEVICE").ok();
    let mut o = VerbsOptions::from_env_lookup(|k| {
        std::env::var(k).ok().or_else(|| {
            (k == "NCCL_IB_HCA")
                .then(|| dev.clone().map(|d| format!("={d}")))
                .flatten()
        })
    })
    .expect("valid NCCL_IB_* settings");
    o.qps_per_connection = qps;
    o
}

fn net_with(qps: usize) -> VerbsNet {
    match VerbsNet::new(options(qps)) {
        Ok(n) => n,
        Err(e) => panic!("no RDMA device (set VERBS_TEST_DEVICE=rxe0 or NCCL_IB_HCA): {e}"),
    }
}

fn net() -> VerbsNet {
    net_with(1)
}

fn check_deadline(start: Instant, what: &str) {
    assert!(start.elapsed() < DEADLINE, "timed out: {what}");
}

fn pair(net: &VerbsNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let mut listener = net.listen().unwrap();
    let mut connector = net.connect(listener.handle()).unwrap();
    let (mut s, mut r) = (None, None);
    let start = Instant::now();
    while s.is_none() || r.is_none() {
        check_deadline(start, "handshake");
        if s.is_none() {
            s = connector.poll_connect().unwrap();
        }
        if r.is_none() {
            r = listener.accept().unwrap();
        }
    }
    (s.unwrap(), r.unwrap())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

/// Polls sends and receives until all complete; returns received sizes.
fn drive(
    sends: &[Request],
    recvs: &[Request],
    s: &mut dyn SendComm,
    r: &mut dyn RecvComm,
) -> Vec<usize> {
    let mut send_done = vec![false; sends.len()];
    let mut got: Vec<Option<usize>> = vec![None; recvs.len()];
    let start = Instant::now();
    loop {
        check_deadline(start, "data transfer");
        for (k, &req) in sends.iter().enumerate() {
            if !send_done[k] {
                send_done[k] = s.test(req).unwrap();
            }
        }
        for (k, &req) in recvs.iter().enumerate() {
            if got[k].is_none() {
                got[k] = r.test(req).unwrap();
            }
        }
        if send_done.iter().all(|&d| d) && got.iter().all(Option::is_some) {
            return got.into_iter().map(Option::unwrap).collect();
        }
    }
}

/// One message of `len` bytes, checked byte for byte, with optional
/// registrations on both sides.
fn roundtrip_with(
    s: &mut dyn SendComm,
    r: &mut dyn RecvComm,
    len: usize,
    tag: u32,
    register: bool,
) -> Duration {
    // At least one byte, so even a 0-byte message has real memory to
    // register.
    let src = pattern(len.max(1), tag as u8);
    let mut dst = vec![0xAAu8; len + 3];
    let (smr, rmr) = if register {
        (
            Some(s.reg_mr(src.as_ptr(), src.len()).unwrap()),
            Some(r.reg_mr(dst.as_mut_ptr(), dst.len()).unwrap()),
        )
    } else {
        (None, None)
    };
    let t = Instant::now();
    // SAFETY: both buffers outlive the transfer, which `drive` completes.
    let rr = unsafe { r.irecv(dst.as_mut_ptr(), dst.len(), tag, rmr) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sr = unsafe { s.isend(src.as_ptr(), len, tag, smr) }
        .unwrap()
        .unwrap();
    let sizes = drive(&[sr], &[rr], s, r);
    let dt = t.elapsed();
    assert_eq!(sizes, [len]);
    assert!(dst[..len] == src[..len], "payload of {len} bytes corrupted");
    assert_eq!(&dst[len..], &[0xAA; 3], "wrote past the message");
    if let (Some(a), Some(b)) = (smr, rmr) {
        s.dereg_mr(a).unwrap();
        r.dereg_mr(b).unwrap();
    }
    dt
}

fn roundtrip(s: &mut dyn SendComm, r: &mut dyn RecvComm, len: usize, tag: u32) -> Duration {
    roundtrip_with(s, r, len, tag, false)
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn handshake_and_small_messages() {
    let net = net();
    let p = net.properties();
    assert_eq!(p.name, "IB");
    eprintln!(
        "device {} ({:?}), GID index {}",
        net.device_name(),
        net.link_layer(),
        net.gid_index()
    );
    let (mut s, mut r) = pair(&net);
    for (i, len) in [0usize, 1, 7, 4096, 65_536, 65_537].into_iter().enumerate() {
        roundtrip(s.as_mut(), r.as_mut(), len, i as u32);
    }
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn one_mib_and_64_mib_exact() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    let dt1 = roundtrip(s.as_mut(), r.as_mut(), 1 << 20, 1);
    let dt = roundtrip(s.as_mut(), r.as_mut(), 64 << 20, 2).as_secs_f64();
    eprintln!(
        "1 MiB: {:.1} ms; 64 MiB: {dt:.3} s = {:.1} MB/s (zero copy, one thread polling both ends)",
        dt1.as_secs_f64() * 1e3,
        (64 << 20) as f64 / dt / 1e6
    );
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn registered_buffers_and_sub_buffers() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    // Explicit registrations passed with the request.
    for (i, len) in [0usize, 5, 4096, 1 << 20].into_iter().enumerate() {
        roundtrip_with(s.as_mut(), r.as_mut(), len, i as u32, true);
    }
    // A buffer inside a registered region, passed without its handle, is
    // served from the registration cache (and stays correct).
    let mut big = vec![0u8; 4 << 20];
    let src = pattern(3 << 20, 9);
    let h: MemHandle = r.reg_mr(big.as_mut_ptr(), big.len()).unwrap();
    let off = 12_345;
    // SAFETY: `big` and `src` outlive the transfer.
    let rr = unsafe { r.irecv(big.as_mut_ptr().add(off), 3 << 20, 9, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sr = unsafe { s.isend(src.as_ptr(), src.len(), 9, None) }
        .unwrap()
        .unwrap();
    assert_eq!(drive(&[sr], &[rr], s.as_mut(), r.as_mut()), [3 << 20]);
    assert!(big[off..off + (3 << 20)] == src[..]);
    assert!(big[..off].iter().all(|&b| b == 0));
    r.dereg_mr(h).unwrap();
    assert!(r.dereg_mr(h).is_err(), "double dereg is an error");
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn split_over_four_queue_pairs() {
    let net = net_with(4);
    let (mut s, mut r) = pair(&net);
    for (i, len) in [0usize, 100, 8192, 8193, (1 << 20) + 13, 8 << 20]
        .into_iter()
        .enumerate()
    {
        roundtrip(s.as_mut(), r.as_mut(), len, i as u32);
    }
    roundtrip_with(s.as_mut(), r.as_mut(), 2 << 20, 77, true);
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn many_in_flight_and_request_limit() {
    for qps in [1, 2] {
        let net = net_with(qps);
        let (mut s, mut r) = pair(&net);
        let sizes: Vec<usize> = (0..MAX_REQUESTS)
            .map(|i| match i % 4 {
                0 => i,
                1 => 4096 + i,
                2 => 70_000 + i,
                _ => 300_000 + 1000 * i,
            })
            .collect();
        let srcs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(n, i as u8))
            .collect();
        let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n + 16]).collect();
        let mut rreqs = Vec::new();
        for (i, d) in dsts.iter_mut().enumerate() {
            // SAFETY: the buffers outlive the transfer.
            rreqs.push(
                unsafe { r.irecv(d.as_mut_ptr(), d.len(), i as u32, None) }
                    .unwrap()
                    .unwrap(),
            );
        }
        // SAFETY: never posted (the queue is full).
        assert!(unsafe { r.irecv(dsts[0].as_mut_ptr(), 1, 0, None) }
            .unwrap()
            .is_none());
        let mut sreqs = Vec::new();
        for (i, src) in srcs.iter().enumerate() {
            // SAFETY: the buffers outlive the transfer.
            sreqs.push(
                unsafe { s.isend(src.as_ptr(), src.len(), i as u32, None) }
                    .unwrap()
                    .unwrap(),
            );
        }
        // SAFETY: never posted (the queue is full).
        assert!(unsafe { s.isend(srcs[0].as_ptr(), 1, 0, None) }
            .unwrap()
            .is_none());
        // Test in reverse order: completion does not depend on test order.
        let rev_s: Vec<Request> = sreqs.iter().rev().copied().collect();
        let rev_r: Vec<Request> = rreqs.iter().rev().copied().collect();
        let got = drive(&rev_s, &rev_r, s.as_mut(), r.as_mut());
        let want: Vec<usize> = sizes.iter().rev().copied().collect();
        assert_eq!(got, want);
        for (i, (src, dst)) in srcs.iter().zip(&dsts).enumerate() {
            assert!(
                dst[..src.len()] == src[..],
                "message {i} corrupted ({qps} QPs)"
            );
        }
        // The comms keep working past the first window (slots wrap).
        for k in 0..40u32 {
            roundtrip(s.as_mut(), r.as_mut(), (k as usize * 997) % 100_000, k);
        }
        assert!(s.test(sreqs[0]).is_err(), "a reported request is gone");
    }
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn tag_mismatch_fails_both_ends() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    let src = [1u8; 10];
    let mut dst = [0u8; 10];
    // SAFETY: buffers outlive the comms' use of them.
    let rr = unsafe { r.irecv(dst.as_mut_ptr(), 10, 7, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sr = unsafe { s.isend(src.as_ptr(), 10, 8, None) }
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let (mut rerr, mut serr) = (None, None);
    while rerr.is_none() || serr.is_none() {
        check_deadline(start, "mismatch");
        if rerr.is_none() {
            match r.test(rr) {
                Ok(None) => {}
                Ok(Some(n)) => panic!("received {n} bytes despite the tag mismatch"),
                Err(e) => rerr = Some(e),
            }
        }
        if serr.is_none() {
            match s.test(sr) {
                Ok(false) => {}
                Ok(true) => panic!("send completed despite the tag mismatch"),
                Err(e) => serr = Some(e),
            }
        }
    }
    let rerr = rerr.unwrap();
    assert!(
        matches!(
            rerr,
            NetError::TagMismatch {
                expected: 7,
                got: 8
            }
        ),
        "{rerr}"
    );
    let serr = serr.unwrap();
    assert!(
        matches!(
            serr,
            NetError::TagMismatch {
                expected: 7,
                got: 8
            }
        ),
        "{serr}"
    );
    assert!(
        matches!(r.test(rr), Err(NetError::TagMismatch { .. })),
        "the comm stays failed"
    );
    assert_eq!(dst, [0u8; 10]);
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn truncation_fails_and_writes_nothing() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    for (posted, sent) in [(50usize, 100usize), (100_000, 200_000)] {
        let src = vec![1u8; sent];
        let mut dst = vec![0u8; posted];
        // SAFETY: buffers outlive the comms' use of them.
        let rr = unsafe { r.irecv(dst.as_mut_ptr(), posted, 3, None) }
            .unwrap()
            .unwrap();
        // SAFETY: as above.
        let _sr = unsafe { s.isend(src.as_ptr(), sent, 3, None) }
            .unwrap()
            .unwrap();
        let start = Instant::now();
        let err = loop {
            check_deadline(start, "recv");
            match r.test(rr) {
                Ok(None) => continue,
                Ok(Some(n)) => panic!("received {n} bytes into a {posted}-byte buffer"),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(err, NetError::Truncated { posted: p, got: g } if p == posted && g == sent),
            "{err}"
        );
        assert!(dst.iter().all(|&b| b == 0), "nothing written on truncation");
        // Fresh pair for the next case: this one stays failed.
        let (s2, r2) = pair(&net);
        s = s2;
        r = r2;
    }
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn peer_close_gives_closed() {
    let net = net();
    // The receiver sees the sender go away.
    let (s, mut r) = pair(&net);
    drop(s);
    let mut dst = [0u8; 8];
    // SAFETY: `dst` outlives `r`'s use of it.
    let rr = unsafe { r.irecv(dst.as_mut_ptr(), 8, 0, None) }
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let err = loop {
        check_deadline(start, "recv close");
        match r.test(rr) {
            Ok(None) => continue,
            Ok(Some(_)) => panic!("received from a closed peer"),
            Err(e) => break e,
        }
    };
    assert!(matches!(&err, NetError::Closed(_)), "{err}");
    eprintln!(
        "receiver noticed the close after {:?}: {err}",
        start.elapsed()
    );

    // The sender sees the receiver go away.
    let (mut s, r) = pair(&net);
    drop(r);
    let src = vec![0u8; 64 << 10];
    // SAFETY: `src` outlives `s`.
    let req = unsafe { s.isend(src.as_ptr(), src.len(), 0, None) }
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let err = loop {
        check_deadline(start, "send close");
        match s.test(req) {
            Ok(false) => continue,
            Ok(true) => panic!("send completed to a closed peer"),
            Err(e) => break e,
        }
    };
    assert!(matches!(&err, NetError::Closed(_)), "{err}");
    // A completed exchange followed by a close is not an error.
    let (mut s, mut r) = pair(&net);
    roundtrip(s.as_mut(), r.as_mut(), 1000, 1);
    drop(s);
    drop(r);
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn bad_handles_and_strays_are_rejected() {
    let net = net();
    assert!(matches!(
        net.connect(&[0u8; 64]),
        Err(NetError::BadHandle(_))
    ));
    // A stray TCP connection to the side socket is dropped; the real peer
    // still connects.
    let mut listener = net.listen().unwrap();
    let h = transport_verbs::wire::VerbsHandle::decode(listener.handle()).unwrap();
    let mut stray = std::net::TcpStream::connect(h.addr).unwrap();
    std::io::Write::write_all(&mut stray, b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut connector = net.connect(listener.handle()).unwrap();
    let (mut s, mut r) = (None, None);
    let start = Instant::now();
    while s.is_none() || r.is_none() {
        check_deadline(start, "handshake with a stray");
        if s.is_none() {
            s = connector.poll_connect().unwrap();
        }
        if r.is_none() {
            r = listener.accept().unwrap();
        }
    }
    let (mut s, mut r) = (s.unwrap(), r.unwrap());
    roundtrip(s.as_mut(), r.as_mut(), 4096, 5);
    assert!(listener.accept().is_err(), "a listener accepts once");
}

#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn options_reach_the_queue_pairs() {
    // Non-default timeout / retry / TC / SL still connect and move data.
    let mut o = options(1);
    o.timeout = 14;
    o.retry_cnt = 3;
    o.traffic_class = 106;
    o.service_level = 0;
    let net = VerbsNet::new(o).unwrap();
    let (mut s, mut r) = pair(&net);
    roundtrip(s.as_mut(), r.as_mut(), 100_000, 1);
    // A typed error survives the trip through NetError.
    let e: NetError = VerbsError::NoDevice("x".into()).into();
    assert!(VerbsError::from_net(&e).is_some());
}
