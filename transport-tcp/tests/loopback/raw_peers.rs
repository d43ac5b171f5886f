//! Raw sockets against the transport: strays at the listener, a stream
//! that arrives byte by byte, a hostile length header.

use super::{check_deadline, net, pattern, roundtrip};
use nccl_net::{Net, NetError, Request};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use transport_tcp::TcpHandle;

#[test]
fn strays_are_dropped_and_real_connection_accepted() {
    let net = net();
    let mut listener = net.listen().unwrap();
    let handle = TcpHandle::decode(listener.handle()).unwrap();
    let addr = handle.addr;
    assert_eq!(addr.ip(), net.local_ip());

    // A stray presenting the right magic but the wrong nonce.
    let mut wrong = handle.hello();
    wrong[15] ^= 0xff;
    let mut stray_nonce = TcpStream::connect(addr).unwrap();
    stray_nonce.write_all(&wrong).unwrap();
    // A stray sending garbage, one closing at once, one staying silent.
    let mut stray_garbage = TcpStream::connect(addr).unwrap();
    stray_garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    drop(TcpStream::connect(addr).unwrap());
    let _stray_silent = TcpStream::connect(addr).unwrap();
    // A stray sending half a greeting, then closing.
    let mut stray_half = TcpStream::connect(addr).unwrap();
    stray_half.write_all(&handle.hello()[..10]).unwrap();
    drop(stray_half);

    // Let the listener see (and reject) the strays before the real peer.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(200) {
        assert!(listener.accept().unwrap().is_none());
    }
    // Rejected strays were closed.
    for s in [&mut stray_nonce, &mut stray_garbage] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("stray not closed: {other:?}"),
        }
    }

    let mut connector = net.connect(listener.handle()).unwrap();
    let (mut s, mut r) = (None, None);
    let start = Instant::now();
    while s.is_none() || r.is_none() {
        check_deadline(start, "handshake after strays");
        if s.is_none() {
            s = connector.poll_connect().unwrap();
        }
        if r.is_none() {
            r = listener.accept().unwrap();
        }
    }
    let (mut s, mut r) = (s.unwrap(), r.unwrap());
    roundtrip(&mut s, &mut r, 1000, 1);
    // One connection per listener.
    assert!(listener.accept().is_err());
}

/// A raw peer that writes the wire format byte by byte, polling the
/// receiver between bytes, so every header and payload arrives in pieces.
#[test]
fn receiver_handles_fragmented_stream() {
    let net = net();
    let mut listener = net.listen().unwrap();
    let handle = TcpHandle::decode(listener.handle()).unwrap();
    let mut raw = TcpStream::connect(handle.addr).unwrap();
    raw.set_nodelay(true).unwrap();
    raw.write_all(&handle.hello()).unwrap();
    let start = Instant::now();
    let mut r = loop {
        check_deadline(start, "accept raw peer");
        if let Some(r) = listener.accept().unwrap() {
            break r;
        }
    };
    let payloads: Vec<Vec<u8>> = vec![vec![], pattern(5, 1), pattern(40, 2), vec![9]];
    let mut wire = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        wire.extend_from_slice(&(i as u32 + 100).to_le_bytes());
        wire.extend_from_slice(&(p.len() as u64).to_le_bytes());
        wire.extend_from_slice(p);
    }
    let mut dsts: Vec<Vec<u8>> = payloads.iter().map(|_| vec![0u8; 64]).collect();
    let reqs: Vec<Request> = dsts
        .iter_mut()
        .enumerate()
        .map(|(i, d)| {
            // SAFETY: `dsts` outlives `r` and is read only after completion.
            unsafe { r.irecv(d.as_mut_ptr(), d.len(), i as u32 + 100, None) }
                .unwrap()
                .unwrap()
        })
        .collect();
    let mut got = vec![None; reqs.len()];
    for b in &wire {
        raw.write_all(std::slice::from_ref(b)).unwrap();
        for (k, &req) in reqs.iter().enumerate() {
            if got[k].is_none() {
                got[k] = r.test(req).unwrap();
            }
        }
    }
    while got.iter().any(Option::is_none) {
        check_deadline(start, "fragmented receive");
        for (k, &req) in reqs.iter().enumerate() {
            if got[k].is_none() {
                got[k] = r.test(req).unwrap();
            }
        }
    }
    for (k, p) in payloads.iter().enumerate() {
        assert_eq!(got[k], Some(p.len()));
        assert_eq!(&dsts[k][..p.len()], &p[..]);
    }
}

/// A raw peer announcing an absurd length gets a clean error, no panic.
#[test]
fn hostile_length_is_truncation_not_panic() {
    let net = net();
    let mut listener = net.listen().unwrap();
    let handle = TcpHandle::decode(listener.handle()).unwrap();
    let mut raw = TcpStream::connect(handle.addr).unwrap();
    raw.write_all(&handle.hello()).unwrap();
    raw.write_all(&7u32.to_le_bytes()).unwrap();
    raw.write_all(&u64::MAX.to_le_bytes()).unwrap();
    let start = Instant::now();
    let mut r = loop {
        check_deadline(start, "accept raw peer");
        if let Some(r) = listener.accept().unwrap() {
            break r;
        }
    };
    let mut dst = [0u8; 16];
    // SAFETY: `dst` outlives `r`.
    let req = unsafe { r.irecv(dst.as_mut_ptr(), 16, 7, None) }
        .unwrap()
        .unwrap();
    let err = loop {
        check_deadline(start, "hostile header");
        match r.test(req) {
            Ok(None) => continue,
            Ok(Some(n)) => panic!("accepted {n} bytes"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, NetError::Truncated { posted: 16, got } if got == usize::MAX),
        "{err}"
    );
}
