//! The eager (tiny-message) path: `send_eager` / `recv_eager`, alone and
//! mixed with requests on the same connection.

use super::net;
use nccl_net::{NetError, RecvComm, SendComm};
use nccl_rs::testing::shm::{irecv, isend, pair, pattern, poll};
use nccl_rs::transport::shm::{ShmNet, ShmOptions};
use nccl_rs::transport::NetResult;

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
    let (mut s, mut r) = pair(&net());
    assert_eq!((s.eager_max(), r.eager_max()), (4096, 4096));
    let big = pattern(10_000, 1);
    // Sealed inline (1, 0, 40 bytes), unsealed inline (41, 48), sealed on
    // lines of their own (49, 100, the limit).
    let sizes = [1, 0, 40, 41, 48, 49, 100, 4096];
    let msgs: Vec<Vec<u8>> = sizes.iter().map(|&n| pattern(n, 10 + n as u64)).collect();
    let tag = |i: usize| 2 + i as u32;
    // A request, then the eager sends, then a request again.
    let q = isend(s.as_mut(), &big, 1);
    for (i, m) in msgs.iter().enumerate() {
        assert!(
            send_eager(s.as_mut(), m, tag(i)).unwrap(),
            "{} bytes",
            m.len()
        );
    }
    let q2 = isend(s.as_mut(), &msgs[0], 99);
    poll("sends", || {
        Ok((s.test(q).unwrap() && s.test(q2).unwrap()).then_some(()))
    })
    .unwrap();

    let mut got = vec![0u8; 10_000];
    let rq = irecv(r.as_mut(), &mut got, 1);
    // An eager receive while a request is posted is refused.
    let mut buf = vec![0xAAu8; 4096];
    assert!(matches!(
        recv_eager(r.as_mut(), &mut buf, 2),
        Err(NetError::Other(_))
    ));
    assert_eq!(poll("big", || r.test(rq)).unwrap(), 10_000);
    assert!(got == big);
    for (i, m) in msgs.iter().enumerate() {
        // Into a buffer just large enough, so an overrun would show.
        let mut buf = vec![0xAAu8; m.len() + 8];
        let n = recv_eager_poll(r.as_mut(), &mut buf[..m.len()], tag(i)).unwrap();
        assert_eq!(n, m.len());
        assert!(
            buf[..n] == m[..] && buf[n..] == [0xAA; 8],
            "{} bytes",
            m.len()
        );
    }
    let mut last = vec![0u8; 1];
    let rq = irecv(r.as_mut(), &mut last, 99);
    assert_eq!(poll("last", || r.test(rq)).unwrap(), 1);
    assert!(last == msgs[0]);
    // Nothing more: an eager receive says not yet.
    assert_eq!(recv_eager(r.as_mut(), &mut buf, 6).unwrap(), None);
}

/// Frames of several lines wrap past the ring's end, sealed and not (41
/// to 48 bytes), and a small ring limits eager messages to under half of
/// it.
#[test]
fn eager_frames_wrap_around_the_ring() {
    let (mut s, mut r) = pair(&small_ring());
    assert_eq!((s.eager_max(), r.eager_max()), (1984, 1984));
    let mut sent = Vec::new();
    for round in 0..40u64 {
        // Two or three frames in flight, of odd sizes up to the limit.
        for k in 0..(2 + round % 2) {
            let len = [1000, 1984, 44, 7, 333][((round + k) % 5) as usize];
            let m = pattern(len, round * 10 + k);
            let sent_now = poll("room", || {
                Ok(send_eager(s.as_mut(), &m, len as u32)?.then_some(()))
            });
            sent_now.unwrap();
            sent.push(m);
            if k == 1 {
                // Make room for a third: read the first.
                let m = sent.remove(0);
                let mut buf = vec![0u8; m.len()];
                let n = recv_eager_poll(r.as_mut(), &mut buf, m.len() as u32).unwrap();
                assert!(n == m.len() && buf == m, "round {round}, {} bytes", m.len());
            }
        }
        for m in sent.drain(..) {
            let mut buf = vec![0u8; m.len()];
            let n = recv_eager_poll(r.as_mut(), &mut buf, m.len() as u32).unwrap();
            assert!(n == m.len() && buf == m, "round {round}, {} bytes", m.len());
        }
    }
}

/// A sender that took the request path may send single copy; an eager
/// receive reads it from the sender as a posted receive would.
#[test]
fn eager_receive_reads_a_single_copy_message() {
    let net = ShmNet::new(ShmOptions {
        cma: true,
        cma_min_bytes: 64,
        ..ShmOptions::default()
    })
    .unwrap();
    let (mut s, mut r) = pair(&net);
    let m = pattern(3000, 5);
    let q = isend(s.as_mut(), &m, 8);
    let mut buf = vec![0u8; 3000];
    assert_eq!(recv_eager_poll(r.as_mut(), &mut buf, 8).unwrap(), 3000);
    assert!(buf == m);
    poll("send", || Ok(s.test(q).unwrap().then_some(()))).unwrap();
}
#[test]
fn eager_receive_names_a_mismatch() {
    let (mut s, mut r) = pair(&net());
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

    let (mut s, mut r) = pair(&net());
    assert!(send_eager(s.as_mut(), &[9; 40], 1).unwrap());
    match recv_eager_poll(r.as_mut(), &mut buf, 1) {
        Err(NetError::Truncated { posted: 8, got: 40 }) => {}
        other => panic!("{other:?}"),
    }
    // Over the limit: refused on both ends, not truncated.
    assert!(send_eager(s.as_mut(), &[0; 4097], 1).is_err());
    let (_, mut r) = pair(&net());
    assert!(recv_eager(r.as_mut(), &mut [0u8; 4097], 1).is_err());
}

#[test]
fn eager_send_waits_for_room() {
    let (mut s, mut r) = pair(&small_ring());
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
    let (mut s, mut r) = pair(&net());
    assert!(send_eager(s.as_mut(), &[5; 8], 1).unwrap());
    drop(s);
    let mut buf = [0u8; 8];
    assert_eq!(recv_eager_poll(r.as_mut(), &mut buf, 1).unwrap(), 8);
    match recv_eager_poll(r.as_mut(), &mut buf, 2) {
        Err(NetError::Closed(_)) => {}
        other => panic!("{other:?}"),
    }
    // A sender with a full ring reports the receiver gone.
    let (mut s, r) = pair(&small_ring());
    while send_eager(s.as_mut(), &[1], 0).unwrap() {}
    drop(r);
    match poll("closed", || Ok(send_eager(s.as_mut(), &[1], 0).err())) {
        Ok(NetError::Closed(_)) => {}
        other => panic!("{other:?}"),
    }
}
