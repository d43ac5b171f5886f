//! Tests of lending received bytes in place (`irecv_lend` / `test_lend` /
//! `release`): the payload is read where it lies in the ring, in two pieces
//! where it wraps; inline, single-copy and larger-than-ring messages are
//! copied as usual.

use super::net;
use nccl_net::{NetError, Received, RecvComm, Request};
use nccl_rs::testing::shm::{isend, pair, pattern, poll};
use nccl_rs::transport::shm::{ShmNet, ShmOptions};

fn lend(r: &mut dyn RecvComm, buf: &mut [u8], tag: u32) -> Request {
    // SAFETY: callers keep `buf` alive and untouched until the request is
    // tested complete.
    poll("irecv_lend slot", || unsafe {
        r.irecv_lend(buf.as_mut_ptr(), buf.len(), tag, None)
    })
    .unwrap()
}

/// The message bytes of a completed receive into `buf`.
fn bytes_of(got: Received, buf: &[u8]) -> Vec<u8> {
    match got {
        Received::Copied(n) => buf[..n].to_vec(),
        Received::Lent { first, second } => {
            let mut v = Vec::with_capacity(first.1 + second.1);
            for (p, n) in [first, second] {
                // SAFETY: lent bytes stay valid until `release`, which the
                // caller calls after this.
                v.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
            }
            v
        }
    }
}

#[test]
fn lent_in_place_with_wrap_copied_otherwise() {
    // 4 slots of 1 KiB: frames wrap around the ring end.
    let net = ShmNet::new(ShmOptions {
        buffsize: 4096,
        slots: 4,
        ..ShmOptions::default()
    })
    .unwrap();
    let (mut s, mut r) = pair(&net);
    let sizes = [
        1000, 2000, 49, 4032, 48, 0, 3000, 5000, 1500, 777, 4033, 64, 2500,
    ];
    let (mut lent, mut wrapped, mut copied) = (0, 0, 0);
    for (i, &n) in sizes.iter().cycle().take(60).enumerate() {
        let data = pattern(n, 300 + i as u64);
        let mut buf = vec![0xAAu8; n + 3];
        let rq = lend(r.as_mut(), &mut buf, 6);
        let sq = isend(s.as_mut(), &data, 6);
        let mut got = None;
        let mut sent = false;
        poll("exchange", || {
            if !sent {
                sent = s.test(sq)?;
            }
            if got.is_none() {
                got = r.test_lend(rq)?;
            }
            Ok((sent && got.is_some()).then_some(()))
        })
        .unwrap_or_else(|e| panic!("message {i} ({n} bytes): {e}"));
        let got = got.unwrap();
        assert_eq!(got.len(), n, "size of message {i}");
        assert!(
            bytes_of(got, &buf) == data,
            "content of message {i} ({n} bytes)"
        );
        match got {
            Received::Lent { second, .. } => {
                lent += 1;
                wrapped += usize::from(second.1 > 0);
                assert!(buf.iter().all(|&b| b == 0xAA), "lent: buffer untouched");
            }
            Received::Copied(_) => {
                copied += 1;
                assert!(n <= 48 || n > 4032, "{n} bytes fit the ring: lent");
                assert_eq!(&buf[n..], &[0xAA; 3], "bytes past message {i}");
            }
        }
        r.release(rq).unwrap();
    }
    assert!(
        lent > 0 && wrapped > 0 && copied > 0,
        "{lent} {wrapped} {copied}"
    );
}

#[test]
fn lent_request_is_not_for_plain_test() {
    let (mut s, mut r) = pair(&net());
    let data = pattern(1000, 1);
    let mut buf = vec![0u8; 1000];
    let rq = lend(r.as_mut(), &mut buf, 0);
    let _sq = isend(s.as_mut(), &data, 0);
    assert!(matches!(
        poll("lent", || r.test(rq).map(|_| Some(()))),
        Err(NetError::Other(_))
    ));
}

#[test]
fn later_messages_wait_for_release() {
    let (mut s, mut r) = pair(&net());
    let (a, b) = (pattern(1000, 2), pattern(2000, 3));
    let (mut ba, mut bb) = (vec![0u8; 1000], vec![0u8; 2000]);
    let qa = lend(r.as_mut(), &mut ba, 0);
    let qb = lend(r.as_mut(), &mut bb, 0);
    let _ = isend(s.as_mut(), &a, 0);
    let _ = isend(s.as_mut(), &b, 0);
    let got = poll("first", || r.test_lend(qa)).unwrap();
    assert!(matches!(got, Received::Lent { .. }));
    assert!(bytes_of(got, &ba) == a);
    // Held: the second message is not read past the lent one.
    assert!((0..100).all(|_| r.test_lend(qb).unwrap().is_none()));
    r.release(qa).unwrap();
    let got = poll("second", || r.test_lend(qb)).unwrap();
    assert!(bytes_of(got, &bb) == b);
    r.release(qb).unwrap();
}

#[test]
fn direct_reduce_off_copies() {
    let net = ShmNet::new(ShmOptions {
        direct_reduce: false,
        ..ShmOptions::default()
    })
    .unwrap();
    let (mut s, mut r) = pair(&net);
    let data = pattern(1000, 9);
    let mut buf = vec![0u8; 1000];
    let rq = lend(r.as_mut(), &mut buf, 0);
    let _sq = isend(s.as_mut(), &data, 0);
    assert_eq!(
        poll("copied", || r.test_lend(rq)).unwrap(),
        Received::Copied(1000)
    );
    assert!(buf == data);
    r.release(rq).unwrap();
}
