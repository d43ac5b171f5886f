//! Spliced sends (`vmsplice` + `splice`, see the crate's `lanes` module):
//! a spliced message completes only once the receiver has read it (its
//! pages are the socket's buffer until then), spliced and copied messages
//! interleave on one connection bit for bit, and a receiver that goes away
//! fails a spliced send instead of leaving it waiting. Every poll loop runs
//! under a deadline.

use nccl_net::{NetError, RecvComm, SendComm};
use std::time::{Duration, Instant};
use transport_tcp::{TcpNet, TcpOptions};

#[path = "common/conn.rs"]
mod conn;
const DEADLINE: Duration = Duration::from_secs(60);
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Three data sockets, striped messages of at least `splice_min` bytes
/// spliced (0: none), however large.
fn net(splice_min: usize) -> TcpNet {
    net_up_to(splice_min, usize::MAX)
}

/// Three data sockets, striped messages of `splice_min..=splice_max` bytes
/// spliced.
fn net_up_to(splice_min: usize, splice_max: usize) -> TcpNet {
    let opts = TcpOptions {
        nsocks: 3,
        nthreads: 1,
        splice_min_bytes: splice_min,
        splice_max_bytes: splice_max,
        ..TcpOptions::default()
    };
    TcpNet::with_local_ip("127.0.0.1".parse().unwrap(), opts).unwrap()
}

fn pair(net: &TcpNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    conn::pair(net, net, DEADLINE)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32) ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(2_654_435_761) as u8)
        .collect()
}

/// Whether a send of `len` bytes (at most 2 MiB: well inside the socket
/// buffers) completes within 50 ms while nobody receives.
fn completes_without_a_reader(net: &TcpNet, len: usize) -> bool {
    let (mut s, mut r) = pair(net);
    let src = pattern(len, 1);
    // SAFETY: `src` outlives `s` (dropped at the end of this function).
    let sr = unsafe { s.isend(src.as_ptr(), src.len(), 5, None) }
        .unwrap()
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(50) {
        if s.test(sr).unwrap() {
            return true;
        }
    }
    // Now receive it; then the send must complete too.
    let mut dst = vec![0u8; len];
    // SAFETY: `dst` outlives `r`; read only after completion.
    let rr = unsafe { r.irecv(dst.as_mut_ptr(), dst.len(), 5, None) }
        .unwrap()
        .unwrap();
    let (mut sent, mut got) = (false, None);
    while !sent || got.is_none() {
        assert!(start.elapsed() < DEADLINE, "transfer timed out");
        sent = sent || s.test(sr).unwrap();
        if got.is_none() {
            got = r.test(rr).unwrap();
        }
    }
    assert_eq!(got, Some(len));
    assert!(dst == src, "payload");
    false
}

#[test]
fn a_spliced_send_completes_only_once_received() {
    assert!(
        !completes_without_a_reader(&net(256 * KIB), MIB),
        "a spliced send completed before the receiver read it"
    );
    // The same message copied into the socket buffers completes at once:
    // the test tells the two apart.
    assert!(
        completes_without_a_reader(&net(0), MIB),
        "a copied send waited"
    );
}

/// Messages above the largest spliced size are copied, those at it spliced.
#[test]
fn only_messages_up_to_the_splice_max_are_spliced() {
    let net = net_up_to(256 * KIB, MIB);
    assert!(
        !completes_without_a_reader(&net, MIB),
        "a message of the largest spliced size was copied"
    );
    assert!(
        completes_without_a_reader(&net, 2 * MIB),
        "a message above the largest spliced size was spliced"
    );
}

/// Spliced (≥ 256 KiB), copied striped and inline messages, sources at odd
/// offsets, all in flight at once; then the same buffers rewritten and sent
/// again (a completed spliced send has released its pages).
#[test]
fn spliced_and_copied_messages_interleave_exactly() {
    let net = net(256 * KIB);
    let (mut s, mut r) = pair(&net);
    let sizes = [MIB, 8, 300 * KIB + 3, 64 * KIB + 1, 2 * MIB + 5, 256 * KIB];
    let mut srcs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n + 3, i as u32))
        .collect();
    for round in 0..2u32 {
        if round == 1 {
            for (i, src) in srcs.iter_mut().enumerate() {
                *src = pattern(src.len(), 100 + i as u32);
            }
        }
        let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xA5; n + 7]).collect();
        let mut rreqs = Vec::new();
        for (i, d) in dsts.iter_mut().enumerate() {
            // SAFETY: `dsts` outlives the transfer; read after completion.
            rreqs.push(unsafe { r.irecv(d.as_mut_ptr(), d.len(), i as u32, None) });
        }
        let mut sreqs = Vec::new();
        for (i, src) in srcs.iter().enumerate() {
            // From byte 3: no source sits on a page or line boundary.
            // SAFETY: `srcs` is not touched until every send completed.
            sreqs.push(unsafe { s.isend(src.as_ptr().add(3), sizes[i], i as u32, None) });
        }
        let mut sreqs: Vec<_> = sreqs
            .into_iter()
            .map(|r| Some(r.unwrap().unwrap()))
            .collect();
        let mut rreqs: Vec<_> = rreqs
            .into_iter()
            .map(|r| Some(r.unwrap().unwrap()))
            .collect();
        let mut got = vec![0usize; sizes.len()];
        let start = Instant::now();
        while sreqs.iter().chain(&rreqs).any(Option::is_some) {
            assert!(start.elapsed() < DEADLINE, "transfer timed out");
            for i in (0..sizes.len()).rev() {
                if let Some(req) = sreqs[i] {
                    if s.test(req).unwrap() {
                        sreqs[i] = None;
                    }
                }
                if let Some(req) = rreqs[i] {
                    if let Some(n) = r.test(req).unwrap() {
                        got[i] = n;
                        rreqs[i] = None;
                    }
                }
            }
        }
        for (i, &n) in sizes.iter().enumerate() {
            assert_eq!(got[i], n, "size of message {i}");
            assert!(
                dsts[i][..n] == srcs[i][3..],
                "round {round}: payload {i} ({n} B)"
            );
            assert!(
                dsts[i][n..].iter().all(|&b| b == 0xA5),
                "wrote past message {i}"
            );
        }
    }
}

/// The receiver goes away while a spliced send waits for its
/// acknowledgement: the send fails (it neither hangs nor completes), and
/// the process survives the broken pipe.
#[test]
fn a_receiver_that_goes_away_fails_a_spliced_send() {
    let net = net(256 * KIB);
    let (mut s, r) = pair(&net);
    let src = pattern(4 * MIB, 9);
    // SAFETY: `src` outlives `s`.
    let sr = unsafe { s.isend(src.as_ptr(), src.len(), 1, None) }
        .unwrap()
        .unwrap();
    for _ in 0..10 {
        assert!(!s.test(sr).unwrap(), "completed without a reader");
    }
    drop(r);
    let start = Instant::now();
    let err = loop {
        assert!(
            start.elapsed() < DEADLINE,
            "no error after the receiver left"
        );
        match s.test(sr) {
            Ok(false) => {}
            Ok(true) => panic!("a spliced send completed to a closed peer"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(&err, NetError::Closed(_) | NetError::Io { .. }),
        "{err}"
    );
}
