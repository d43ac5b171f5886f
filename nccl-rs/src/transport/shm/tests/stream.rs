//! Receives copied in with streaming stores where the caller's hint
//! ([`RecvComm::hint_recv`]) says their buffer will not be read soon, and
//! sends written into the ring so where the sender's hint
//! ([`SendComm::hint_copy`]) says the receiver's CPU is apart, or the
//! ring's traffic has not shown it near lately.

use super::{
    irecv, isend, pair, pattern, patterns, poll, random_sizes, ring_net, send_windowed,
    small_ring_net,
};
use crate::transport::shm::recv::STREAMED;
use nccl_net::{CopyHint, RecvComm, RecvHint, SendComm};

const GUARD: u8 = 0xAA;

/// A hint covering `out[..end]`.
fn hint(out: &[u8], end: usize) -> RecvHint {
    let start = out.as_ptr() as usize;
    RecvHint {
        stream: (start, start + end),
    }
}

/// Sends `msg` and receives it into `out[at..at + msg.len()]` from this
/// thread (the ring holds it whole); returns the bytes streamed meanwhile.
fn send_recv(
    s: &mut dyn SendComm,
    r: &mut dyn RecvComm,
    msg: &[u8],
    out: &mut [u8],
    at: usize,
) -> usize {
    let before = STREAMED.get();
    let q = isend(s, msg, 5);
    let rq = irecv(r, &mut out[at..at + msg.len()], 5);
    let (mut sent, mut got) = (false, None);
    poll("message", || {
        if !sent {
            sent = s.test(q)?;
        }
        if got.is_none() {
            got = r.test(rq)?;
        }
        Ok((sent && got.is_some()).then_some(()))
    })
    .unwrap();
    assert_eq!(got, Some(msg.len()));
    STREAMED.get() - before
}

#[test]
fn receives_inside_the_hinted_range_stream_and_stay_exact() {
    let (mut s, mut r) = pair(&ring_net());
    let mut out = vec![GUARD; 200_000];
    r.hint_recv(hint(&out, 150_000));
    // (offset, length, streamed): odd offsets and lengths; a 40-byte
    // message rides in its header line (no copy of a payload); one
    // straddles the end of the range and one lies past it.
    let cases = [
        (1, 5000, true),
        (5003, 40, false),
        (5100, 70_001, true),
        (80_000, 65_536, true),
        (149_000, 2000, false),
        (160_000, 30_000, false),
    ];
    for (i, &(at, len, streams)) in cases.iter().enumerate() {
        let msg = pattern(len, 40 + i as u64);
        let n = send_recv(s.as_mut(), r.as_mut(), &msg, &mut out, at);
        assert!(out[at..at + len] == msg[..], "message {i} ({len} bytes)");
        assert_eq!(n, if streams { len } else { 0 }, "message {i} streamed");
    }
    // Every byte outside the messages untouched.
    let mut written = vec![false; out.len()];
    for &(at, len, _) in &cases {
        written[at..at + len].fill(true);
    }
    assert!(out.iter().zip(&written).all(|(&b, &w)| w || b == GUARD));
    // A new hint replaces the old one: none now.
    r.hint_recv(RecvHint::default());
    let msg = pattern(5000, 99);
    assert_eq!(send_recv(s.as_mut(), r.as_mut(), &msg, &mut out, 1), 0);
    assert!(out[1..5001] == msg[..]);
}

#[test]
fn streamed_receives_on_a_wrapping_ring_stay_exact() {
    // The copies come in pieces of every alignment.
    let (mut s, mut r) = pair(&small_ring_net());
    let sizes = random_sizes(100, 7);
    let bufs = patterns(&sizes, 300);
    let total: usize = sizes.iter().map(|n| n + 3).sum();
    let mut out = vec![GUARD; total];
    r.hint_recv(hint(&out, total));
    let before = STREAMED.get();
    let expect = bufs.clone();
    let sender = std::thread::spawn(move || send_windowed(s.as_mut(), &bufs, 2, 4));
    let mut at = 3;
    for (i, m) in expect.iter().enumerate() {
        let rq = irecv(r.as_mut(), &mut out[at..at + m.len()], 2);
        assert_eq!(poll("recv", || r.test(rq)).unwrap(), m.len());
        assert!(out[at..at + m.len()] == m[..], "message {i}");
        assert!(out[at - 3..at] == [GUARD; 3], "before message {i}");
        at += m.len() + 3;
    }
    sender.join().unwrap();
    assert!(STREAMED.get() > before, "no piece was streamed");
}

#[test]
fn a_message_read_from_the_senders_shared_memory_streams_too() {
    let len = (2 << 20) + 77;
    let (mut s, mut r) = pair(&super::cma::cma_default());
    let mut shared = crate::ShmBuffer::<u8>::zeroed(len + 4096).unwrap();
    let msg = pattern(len, 12);
    shared[4096..].copy_from_slice(&msg);
    let mut out = vec![GUARD; len + 2];
    r.hint_recv(hint(&out, len + 2));
    let frames = crate::transport::shm::mapped::MAPPED_FRAMES.get();
    let n = send_recv(s.as_mut(), r.as_mut(), &shared[4096..], &mut out, 1);
    assert!(
        crate::transport::shm::mapped::MAPPED_FRAMES.get() > frames,
        "not read through a mapping"
    );
    assert!(out[1..=len] == msg[..] && out[0] == GUARD && out[len + 1] == GUARD);
    assert_eq!(n, len);
}

/// Sends message `i` of `len` bytes (drawn from `seed`) and receives it
/// into `out` at offset 3, checking it and the guards around it; returns
/// the bytes the sender wrote into the ring with streaming stores.
fn sent_streamed(
    s: &mut dyn SendComm,
    r: &mut dyn RecvComm,
    out: &mut [u8],
    i: usize,
    len: usize,
    seed: u64,
) -> usize {
    use crate::transport::shm::send::STREAMED_IN;
    let msg = pattern(len, seed);
    out.fill(GUARD);
    let before = STREAMED_IN.get();
    send_recv(s, r, &msg, out, 3);
    assert!(out[3..3 + len] == msg[..], "message {i} ({len} bytes)");
    assert!(out[..3] == [GUARD; 3] && out[3 + len] == GUARD);
    STREAMED_IN.get() - before
}

#[test]
fn sends_to_a_receiver_apart_stream_into_the_ring_and_stay_exact() {
    let (mut s, mut r) = pair(&ring_net());
    let apart = CopyHint {
        streaming_stores: true,
        ..CopyHint::default()
    };
    let mut out = vec![GUARD; 100_000];
    // (length, streamed): a message under a streamed piece's minimum, and
    // one in its header line, go as before.
    let cases = [
        (70_001, true),
        (1023, false),
        (40, false),
        (5000, true),
        (65_536, true),
    ];
    for (hinted, base) in [(true, 50), (false, 60)] {
        s.hint_copy(if hinted { apart } else { CopyHint::default() });
        for (i, &(len, streams)) in cases.iter().enumerate() {
            let streamed = sent_streamed(s.as_mut(), r.as_mut(), &mut out, i, len, base + i as u64);
            assert_eq!(
                streamed,
                if hinted && streams { len } else { 0 },
                "message {i}"
            );
        }
    }
}
