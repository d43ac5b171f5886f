//! The eager (tiny-message) path: `send_eager` / `recv_eager`, alone and
//! mixed with requests on the same connection.

use super::tests::{irecv, isend, net, pair, pattern, poll};
use super::*;
use nccl_net::{NetError, RecvComm, SendComm};

fn send_eager(s: &mut dyn SendComm, buf: &[u8], tag: u32) -> NetResult<bool> {
    // SAFETY: `buf` is readable for the call.
    unsafe { s.send_eager(buf.as_ptr(), buf.len(), tag) }
}

fn recv_eager(r: &mut dyn RecvComm, buf: &mut [u8], tag: u32) -> NetResult<Option<usize>> {
    // SAFETY: `buf` is writable for the call.
    unsafe { r.recv_eager(buf.as_mut_ptr(), buf.len(), tag) }
}

/// Polls `recv_eager` until a message comes.
fn recv_eager_poll(r: &mut dyn RecvComm, buf: &mut [u8], tag: u32) -> NetResult<usize> {
    poll("eager message", || recv_eager(r, buf, tag))
}

fn small_ring() -> ShmNet {
    ShmNet::new(ShmOptions {
        buffsize: 4 << 10,
        slots: 4,
        ..ShmOptions::default()
    })
    .unwrap()
}

#[test]
fn eager_messages_keep_their_place_among_requests() {
    let (mut s, mut r, _) = pair(&net());
    assert_eq!((s.eager_max(), r.eager_max()), (40, 40));
    let big = pattern(1000, 1);
    let tiny: Vec<Vec<u8>> = (0..4).map(|i| pattern(8 * i + 1, 10 + i as u64)).collect();
    let empty: &[u8] = &[];
    // A request, then eager sends (an empty one and one of the limit's 40
    // bytes among them), then a request again.
    let q = isend(s.as_mut(), &big, 1);
    assert!(send_eager(s.as_mut(), &tiny[0], 2).unwrap());
    assert!(send_eager(s.as_mut(), empty, 3).unwrap());
    let full = pattern(40, 3);
    assert!(send_eager(s.as_mut(), &full, 4).unwrap());
    let q2 = isend(s.as_mut(), &tiny[3], 5);
    poll("sends", || {
        Ok((s.test(q).unwrap() && s.test(q2).unwrap()).then_some(()))
    })
    .unwrap();

    let mut got = vec![0u8; 1000];
    let rq = irecv(r.as_mut(), &mut got, 1);
    // An eager receive while a request is posted is refused.
    let mut buf = [0xAAu8; 40];
    assert!(matches!(
        recv_eager(r.as_mut(), &mut buf, 2),
        Err(NetError::Other(_))
    ));
    assert_eq!(poll("big", || r.test(rq)).unwrap(), 1000);
    assert!(got == big);
    assert_eq!(recv_eager_poll(r.as_mut(), &mut buf[..9], 2).unwrap(), 1);
    assert_eq!(buf[..1], tiny[0][..]);
    assert_eq!(recv_eager_poll(r.as_mut(), &mut buf[..0], 3).unwrap(), 0);
    assert_eq!(recv_eager_poll(r.as_mut(), &mut buf, 4).unwrap(), 40);
    assert!(buf[..] == full[..]);
    let mut last = vec![0u8; 25];
    let rq = irecv(r.as_mut(), &mut last, 5);
    assert_eq!(poll("last", || r.test(rq)).unwrap(), 25);
    assert!(last == tiny[3]);
    // Nothing more: an eager receive says not yet.
    assert_eq!(recv_eager(r.as_mut(), &mut buf, 6).unwrap(), None);
}

#[test]
fn eager_receive_names_a_mismatch() {
    let (mut s, mut r, _) = pair(&net());
    assert!(send_eager(s.as_mut(), &[1, 2, 3, 4], 7).unwrap());
    let mut buf = [0u8; 8];
    match recv_eager_poll(r.as_mut(), &mut buf, 8) {
        Err(NetError::TagMismatch {
            expected: 8,
            got: 7,
        }) => {}
        other => panic!("{other:?}"),
    }
    // The comm stays failed.
    assert!(recv_eager(r.as_mut(), &mut buf, 7).is_err());

    let (mut s, mut r, _) = pair(&net());
    assert!(send_eager(s.as_mut(), &[9; 40], 1).unwrap());
    match recv_eager_poll(r.as_mut(), &mut buf, 1) {
        Err(NetError::Truncated { posted: 8, got: 40 }) => {}
        other => panic!("{other:?}"),
    }
    // Over the limit: refused on both ends, not truncated.
    assert!(send_eager(s.as_mut(), &[0; 41], 1).is_err());
    let (_, mut r, _) = pair(&net());
    assert!(recv_eager(r.as_mut(), &mut [0u8; 41], 1).is_err());
}

#[test]
fn eager_send_waits_for_room() {
    let (mut s, mut r, _) = pair(&small_ring());
    let mut sent = 0u32;
    while send_eager(s.as_mut(), &sent.to_le_bytes(), sent).unwrap() {
        sent += 1;
        assert!(sent <= 64, "a 4 KiB ring holds 64 frame lines");
    }
    assert_eq!(sent, 64);
    let mut buf = [0u8; 4];
    assert_eq!(recv_eager_poll(r.as_mut(), &mut buf, 0).unwrap(), 4);
    // Room again once the receiver releases a line (it releases a slot's
    // worth at a time, or whenever it runs dry; here after the first).
    let next = poll("room", || {
        Ok(send_eager(s.as_mut(), &sent.to_le_bytes(), sent)?.then_some(()))
    });
    next.unwrap();
    for i in 1..=sent {
        assert_eq!(recv_eager_poll(r.as_mut(), &mut buf, i).unwrap(), 4);
        assert_eq!(u32::from_le_bytes(buf), i);
    }
}

#[test]
fn eager_ends_see_the_peer_go() {
    // The receiver drains what was sent, then reports the sender gone.
    let (mut s, mut r, _) = pair(&net());
    assert!(send_eager(s.as_mut(), &[5; 8], 1).unwrap());
    drop(s);
    let mut buf = [0u8; 8];
    assert_eq!(recv_eager_poll(r.as_mut(), &mut buf, 1).unwrap(), 8);
    match recv_eager_poll(r.as_mut(), &mut buf, 2) {
        Err(NetError::Closed(_)) => {}
        other => panic!("{other:?}"),
    }
    // A sender with a full ring reports the receiver gone.
    let (mut s, r, _) = pair(&small_ring());
    while send_eager(s.as_mut(), &[1], 0).unwrap() {}
    drop(r);
    match poll("closed", || Ok(send_eager(s.as_mut(), &[1], 0).err())) {
        Ok(NetError::Closed(_)) => {}
        other => panic!("{other:?}"),
    }
}
