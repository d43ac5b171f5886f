//! Raw sockets against the transport: strays at the listener, a stream
//! that arrives byte by byte, a hostile length header, a garbage header.

use super::wire::{header, inline_unit};
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
/// receiver between bytes, so every header, pad and payload arrives in
/// pieces; the messages claim different alignments, so the pads differ.
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
    let payloads: Vec<Vec<u8>> = vec![
        vec![],
        pattern(5, 1),
        pattern(40, 2),
        vec![9],
        pattern(200, 3),
    ];
    let aligns = [0u8, 17, 63, 16, 40];
    let mut wire = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        wire.extend_from_slice(&inline_unit(i as u32 + 100, p, aligns[i]));
    }
    let mut dsts: Vec<Vec<u8>> = payloads.iter().map(|_| vec![0u8; 256]).collect();
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

/// What a receive of 16 bytes (tag 7) reports when a raw peer writes `wire`
/// after its greeting: it must be an error, not data, a panic or a hang.
fn error_after_raw(wire: &[u8], what: &str) -> NetError {
    let net = net();
    let mut listener = net.listen().unwrap();
    let handle = TcpHandle::decode(listener.handle()).unwrap();
    let mut raw = TcpStream::connect(handle.addr).unwrap();
    raw.write_all(&handle.hello()).unwrap();
    raw.write_all(wire).unwrap();
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
    loop {
        check_deadline(start, what);
        match r.test(req) {
            Ok(None) => continue,
            Ok(Some(n)) => panic!("{what}: accepted {n} bytes"),
            Err(e) => return e,
        }
    }
}

/// A raw peer announcing an absurd length gets a clean error, no panic.
#[test]
fn hostile_length_is_truncation_not_panic() {
    let err = error_after_raw(&header(7, u64::MAX, 0), "hostile header");
    assert!(
        matches!(err, NetError::Truncated { posted: 16, got } if got == usize::MAX),
        "{err}"
    );
}

/// A header with a reserved byte set (garbage, or a peer speaking another
/// format) is a protocol error naming the peer, not a panic or a hang.
#[test]
fn garbage_header_is_protocol_error() {
    let mut bad = header(7, 8, 0);
    bad[14] = 0xff;
    let err = error_after_raw(&bad, "garbage header");
    assert!(matches!(err, NetError::Protocol(_)), "{err}");
    assert!(err.to_string().contains("header"), "{err}");
}

/// Our sender against a raw listener: what it writes is the documented
/// wire format byte for byte, each payload placed in its 64-byte unit as its
/// source lies in its cache line, pads zero.
#[test]
fn sender_writes_documented_units() {
    let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let handle = TcpHandle::single(raw.local_addr().unwrap(), *b"unitunit", 1);
    let net = net();
    let mut connector = net.connect(&handle.encode()).unwrap();
    let (mut peer, _) = raw.accept().unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let start = Instant::now();
    let mut s = loop {
        check_deadline(start, "connect to raw listener");
        if let Some(s) = connector.poll_connect().unwrap() {
            break s;
        }
    };
    let mut hello = [0u8; 16];
    peer.read_exact(&mut hello).unwrap();
    assert_eq!(hello, handle.hello());
    // Sources at several alignments within one buffer, of several sizes.
    let src = pattern(10_000, 9);
    let cases = [
        (0usize, 8usize),
        (16, 300),
        (5, 4096),
        (63, 1),
        (40, 0),
        (1, 5000),
    ];
    let base = src.as_ptr() as usize;
    let mut expect = Vec::new();
    let mut reqs = Vec::new();
    for (i, &(off, len)) in cases.iter().enumerate() {
        let p = &src[off..off + len];
        let align = ((base + off) % 64) as u8;
        expect.extend_from_slice(&inline_unit(i as u32, p, align));
        // SAFETY: `src` outlives the requests, which complete below.
        reqs.push(
            unsafe { s.isend(p.as_ptr(), len, i as u32, None) }
                .unwrap()
                .unwrap(),
        );
    }
    let mut wire = vec![0u8; expect.len()];
    let (mut got, mut sent) = (0, vec![false; reqs.len()]);
    while got < wire.len() || sent.contains(&false) {
        check_deadline(start, "read the sender's stream");
        for (k, &req) in reqs.iter().enumerate() {
            if !sent[k] {
                sent[k] = s.test(req).unwrap();
            }
        }
        if got < wire.len() {
            got += peer.read(&mut wire[got..]).unwrap();
        }
    }
    assert_eq!(wire.len() % 64, 0);
    assert!(
        wire == expect,
        "the stream differs from the documented units"
    );
}
