//! Tests of split single-copy messages (`shm::split`): the sender
//! copies part of a message into the receiver only when it says it is
//! idle, a receiver that goes away stops it from writing, and odd sizes
//! arrive exact with both ends running.

use super::{irecv, isend, pair, pattern, patterns, poll, send_windowed};
use crate::transport::shm::cma::CmaOpts;
use crate::transport::shm::connect::{ShmConnector, ShmListener};
use crate::transport::shm::segment::Geometry;
use crate::transport::shm::split::{cut, SPLIT_MIN_BYTES};
use crate::transport::shm::*;
use nccl_net::{CopyHint, NetError};

const IDLE: CopyHint = CopyHint {
    single_copy: true,
    sender_idle: true,
    receives: false,
    streaming_stores: false,
    buffered_max: 0,
};

fn cma_net() -> ShmNet {
    ShmNet::new(ShmOptions {
        cma: true,
        ..ShmOptions::default()
    })
    .unwrap()
}

/// Bytes the receiver copies in its first run: half of the pieces.
fn first_run(len: usize) -> usize {
    let (piece, n) = cut(len);
    (usize::from(n.div_ceil(2)) * piece).min(len)
}

#[test]
fn an_idle_sender_copies_the_back_of_the_message() {
    let len = (4 << 20) + 4097;
    let data = pattern(len, 5);
    let (mut s, mut r) = pair(&cma_net());
    s.hint_copy(IDLE);
    let q = isend(s.as_mut(), &data, 3);
    let mut buf = vec![0u8; len];
    let rq = irecv(r.as_mut(), &mut buf, 3);
    // One poll: the receiver offers the message and copies its first run.
    assert_eq!(r.test(rq).unwrap(), None);
    let half = first_run(len);
    assert!(buf[..half] == data[..half], "the receiver's run");
    assert!(buf[half..].iter().all(|&b| b == 0), "nothing more yet");
    // The sender, polled, copies the rest into the receiver's buffer; it is
    // not complete until the receiver has seen that.
    assert!(!s.test(q).unwrap());
    assert!(buf == data, "the sender wrote the back of the message");
    assert_eq!(r.test(rq).unwrap(), Some(len));
    poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
}

/// Sends one message of `len` bytes from an idle sender into a shared
/// destination (at an odd offset), as the test above; returns how many
/// runs the sender wrote through a mapping.
fn idle_sender_into_shared(len: usize, refuse_mapping: bool) -> usize {
    use crate::transport::shm::mapped::{MAPPED_WRITES, REFUSE_MAPPING};
    REFUSE_MAPPING.with(|r| r.set(refuse_mapping));
    let data = pattern(len, 8);
    let (mut s, mut r) = pair(&cma_net());
    s.hint_copy(IDLE);
    let before = MAPPED_WRITES.with(|n| n.get());
    let q = isend(s.as_mut(), &data, 3);
    let mut shared = crate::ShmBuffer::<u8>::zeroed(len + 8192).unwrap();
    let buf = &mut shared[4097..4097 + len];
    let rq = irecv(r.as_mut(), buf, 3);
    assert_eq!(r.test(rq).unwrap(), None);
    assert!(!s.test(q).unwrap());
    let half = first_run(len);
    assert!(buf[..half] == data[..half], "the receiver's run");
    assert!(buf[half..] == data[half..], "the sender's runs");
    assert_eq!(r.test(rq).unwrap(), Some(len));
    poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
    REFUSE_MAPPING.with(|r| r.set(false));
    MAPPED_WRITES.with(|n| n.get()) - before
}

#[test]
fn an_idle_sender_writes_into_a_shared_destination_through_a_mapping() {
    let len = (4 << 20) + 4097;
    assert!(
        idle_sender_into_shared(len, false) >= 1,
        "no run was mapped"
    );
    // Mapping refused: the same bytes by `process_vm_writev`.
    assert_eq!(idle_sender_into_shared(len, true), 0);
}

#[test]
fn a_busy_sender_leaves_the_copy_to_the_receiver() {
    let len = 1 << 20;
    let data = pattern(len, 6);
    // Single copy, but the sender has other work: the receiver copies all
    // of it in one poll.
    let (mut s, mut r) = pair(&cma_net());
    s.hint_copy(CopyHint {
        single_copy: true,
        sender_idle: false,
        receives: false,
        streaming_stores: false,
        buffered_max: 0,
    });
    let q = isend(s.as_mut(), &data, 1);
    let mut buf = vec![0u8; len];
    let rq = irecv(r.as_mut(), &mut buf, 1);
    assert_eq!(r.test(rq).unwrap(), Some(len));
    assert!(buf == data);
    poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
    // A receiver that does not split (`ShmOptions::cma_split` off there) does not
    // publish its probe word, so the sender never offers to help.
    let geom = Geometry::new(4 << 20, 8).unwrap();
    let no_split = CmaOpts {
        min: 16 << 10,
        split: false,
    };
    let split = CmaOpts {
        split: true,
        ..no_split
    };
    let mut l = ShmListener::new(geom, Some(no_split), true).unwrap();
    let mut c = ShmConnector::connect(l.handle(), Some(split)).unwrap();
    let mut r = poll("accept", || l.accept()).unwrap();
    let mut s = poll("connect", || c.poll_connect()).unwrap();
    s.hint_copy(IDLE);
    let q = isend(s.as_mut(), &data, 2);
    let mut buf = vec![0u8; len];
    let rq = irecv(r.as_mut(), &mut buf, 2);
    assert_eq!(r.test(rq).unwrap(), Some(len));
    assert!(buf == data);
    poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
}

#[test]
fn a_receiver_going_away_withdraws_its_offer() {
    let len = 2 << 20;
    let data = pattern(len, 7);
    let (mut s, mut r) = pair(&cma_net());
    s.hint_copy(IDLE);
    let q = isend(s.as_mut(), &data, 0);
    let mut buf = vec![0u8; len];
    let rq = irecv(r.as_mut(), &mut buf, 0);
    assert_eq!(r.test(rq).unwrap(), None);
    drop(r);
    // The buffer is the caller's again: the sender must not write into it.
    let got = poll("closed", || Ok(s.test(q)?.then_some(())));
    assert!(matches!(got, Err(NetError::Closed(_))), "{got:?}");
    let half = first_run(len);
    assert!(
        buf[half..].iter().all(|&b| b == 0),
        "no write after the withdrawal"
    );
}

#[test]
fn odd_sizes_with_both_ends_running() {
    let sizes: Vec<usize> = [
        SPLIT_MIN_BYTES - 1,
        SPLIT_MIN_BYTES,
        SPLIT_MIN_BYTES + 1,
        (64 << 10) + 4095,
        256 << 10,
        (512 << 10) + 1,
        (1 << 20) + 3,
        (4 << 20) + 7,
        (9 << 20) + 1,
    ]
    .repeat(3);
    let bufs = patterns(&sizes, 300);
    let (mut s, mut r) = pair(&cma_net());
    s.hint_copy(IDLE);
    let sender = std::thread::spawn(move || send_windowed(s.as_mut(), &bufs, 9, 4));
    for (i, &n) in sizes.iter().enumerate() {
        let mut buf = vec![0u8; n];
        let q = irecv(r.as_mut(), &mut buf, 9);
        assert_eq!(poll("recv", || r.test(q)).unwrap(), n);
        assert!(
            buf == pattern(n, 300 + i as u64),
            "message {i} of {n} bytes"
        );
    }
    sender.join().unwrap();
}
