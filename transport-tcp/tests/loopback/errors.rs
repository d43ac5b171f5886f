//! Errors a well-behaved peer causes: tag mismatch, truncation, a peer
//! that goes away, a bad handle and a refused connect.

use super::{check_deadline, net, pair};
use nccl_net::{Net, NetError};
use std::time::{Duration, Instant};

#[test]
fn tag_mismatch() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    let src = [1u8; 10];
    let mut dst = [0u8; 10];
    // SAFETY: buffers outlive the comms' use of them (comms dropped first
    // is not needed: the receive fails and the send completes).
    let rr = unsafe { r.irecv(dst.as_mut_ptr(), 10, 7, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sr = unsafe { s.isend(src.as_ptr(), 10, 8, None) }
        .unwrap()
        .unwrap();
    let start = Instant::now();
    while !s.test(sr).unwrap() {
        check_deadline(start, "send");
    }
    let err = loop {
        check_deadline(start, "recv");
        match r.test(rr) {
            Ok(None) => continue,
            Ok(Some(n)) => panic!("received {n} bytes despite the tag mismatch"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            err,
            NetError::TagMismatch {
                expected: 7,
                got: 8
            }
        ),
        "{err}"
    );
    // The comm stays failed.
    assert!(matches!(r.test(rr), Err(NetError::TagMismatch { .. })));
    drop(r);
    let _ = dst;
}

#[test]
fn truncation() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    let src = [1u8; 100];
    let mut dst = [0u8; 50];
    // SAFETY: buffers outlive the comms' use of them.
    let rr = unsafe { r.irecv(dst.as_mut_ptr(), 50, 3, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let _sr = unsafe { s.isend(src.as_ptr(), 100, 3, None) }
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let err = loop {
        check_deadline(start, "recv");
        match r.test(rr) {
            Ok(None) => continue,
            Ok(Some(n)) => panic!("received {n} bytes into a 50-byte buffer"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            err,
            NetError::Truncated {
                posted: 50,
                got: 100
            }
        ),
        "{err}"
    );
    assert_eq!(dst, [0u8; 50], "nothing written on truncation");
}

#[test]
fn peer_close_gives_closed() {
    let net = net();
    // Receiver sees the sender go away.
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
    assert!(
        matches!(&err, NetError::Closed(p) if p.contains("127.0.0.1")),
        "{err}"
    );

    // Sender sees the receiver go away.
    let (mut s, r) = pair(&net);
    drop(r);
    let src = vec![0u8; 64 << 10];
    let start = Instant::now();
    let err = 'outer: loop {
        check_deadline(start, "send close");
        // SAFETY: `src` outlives `s`.
        let req = match unsafe { s.isend(src.as_ptr(), src.len(), 0, None) } {
            Ok(Some(req)) => req,
            Ok(None) => panic!("send queue full without an error"),
            Err(e) => break e,
        };
        loop {
            check_deadline(start, "send close");
            match s.test(req) {
                Ok(true) => break,
                Ok(false) => continue,
                Err(e) => break 'outer e,
            }
        }
    };
    assert!(
        matches!(&err, NetError::Closed(p) if p.contains("127.0.0.1")),
        "{err}"
    );
}

#[test]
fn bad_handle_and_refused_connect() {
    let net = net();
    assert!(matches!(
        net.connect(&[0u8; 10]),
        Err(NetError::BadHandle(_))
    ));
    // A listener that is gone: connect eventually fails (after retries).
    let handle = {
        let l = net.listen().unwrap();
        l.handle().to_vec()
    };
    let mut c = net.connect(&handle).unwrap();
    let start = Instant::now();
    let err = loop {
        check_deadline(start, "refused connect");
        match c.poll_connect() {
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Ok(Some(_)) => panic!("connected to a closed listener"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            err,
            NetError::Io {
                call: "connect",
                ..
            }
        ),
        "{err}"
    );
}
