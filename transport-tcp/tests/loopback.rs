//! The TCP transport over loopback: handshake, data path, errors, strays.
//! Every poll loop runs under a deadline so nothing can hang.

use nccl_net::{Net, NetError, RecvComm, Request, SendComm};
use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};
use transport_tcp::{AddrFamily, TcpHandle, TcpNet, TcpOptions, MAX_REQUESTS};

const DEADLINE: Duration = Duration::from_secs(20);

/// One socket per connection: the raw peers below speak that wire format
/// (`tests/striping.rs` covers several sockets and helper threads).
fn net_on(ip: &str) -> TcpNet {
    let opts = TcpOptions {
        nsocks: 1,
        nthreads: 1,
        ..TcpOptions::default()
    };
    TcpNet::with_local_ip(ip.parse().unwrap(), opts).unwrap()
}

fn net() -> TcpNet {
    net_on("127.0.0.1")
}

fn check_deadline(start: Instant, what: &str) {
    assert!(start.elapsed() < DEADLINE, "timed out: {what}");
}

/// Listens on `net`, connects from `net`, polls both until established.
fn pair(net: &TcpNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
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

/// Polls posted sends and receives (comm index, request) round-robin until
/// every one completes. Returns the received sizes in posting order.
fn drive(
    sends: Vec<(usize, Request)>,
    recvs: Vec<(usize, Request)>,
    s: &mut [&mut Box<dyn SendComm>],
    r: &mut [&mut Box<dyn RecvComm>],
) -> Vec<usize> {
    let mut send_done = vec![false; sends.len()];
    let mut recv_done: Vec<Option<usize>> = vec![None; recvs.len()];
    let start = Instant::now();
    loop {
        check_deadline(start, "data transfer");
        for (k, &(c, req)) in sends.iter().enumerate() {
            if !send_done[k] {
                send_done[k] = s[c].test(req).unwrap();
            }
        }
        for (k, &(c, req)) in recvs.iter().enumerate() {
            if recv_done[k].is_none() {
                recv_done[k] = r[c].test(req).unwrap();
            }
        }
        if send_done.iter().all(|&d| d) && recv_done.iter().all(Option::is_some) {
            return recv_done.into_iter().map(Option::unwrap).collect();
        }
    }
}

/// Sends one message of `len` bytes and checks it arrives intact.
fn roundtrip(
    s: &mut Box<dyn SendComm>,
    r: &mut Box<dyn RecvComm>,
    len: usize,
    tag: u32,
) -> Duration {
    let src = pattern(len, tag as u8);
    let mut dst = vec![0xAAu8; len + 3];
    let t = Instant::now();
    // SAFETY: both buffers outlive the transfer, which `drive` completes.
    let rr = unsafe { r.irecv(dst.as_mut_ptr(), dst.len(), tag, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sr = unsafe { s.isend(src.as_ptr(), len, tag, None) }
        .unwrap()
        .unwrap();
    let sizes = drive(vec![(0, sr)], vec![(0, rr)], &mut [s], &mut [r]);
    let dt = t.elapsed();
    assert_eq!(sizes, [len]);
    assert!(dst[..len] == src[..], "payload of {len} bytes corrupted");
    assert_eq!(&dst[len..], &[0xAA; 3], "wrote past the message");
    dt
}

#[test]
fn handshake_and_small_messages() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    for (i, len) in [0usize, 1, 7, 12, 13, 4096].into_iter().enumerate() {
        roundtrip(&mut s, &mut r, len, i as u32);
    }
}

#[test]
fn one_mib_and_64_mib() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    roundtrip(&mut s, &mut r, 1 << 20, 1);
    let dt = roundtrip(&mut s, &mut r, 64 << 20, 2).as_secs_f64();
    eprintln!(
        "64 MiB over loopback, one thread polling both sides: {:.3} s, {:.2} GB/s",
        dt,
        (64 << 20) as f64 / dt / 1e9
    );
}

#[test]
fn ipv6_loopback() {
    let ip: IpAddr = "::1".parse().unwrap();
    if std::net::TcpListener::bind((ip, 0)).is_err() {
        eprintln!("no IPv6 loopback here; skipping");
        return;
    }
    let net = TcpNet::new(TcpOptions {
        ifname: Some("=lo".into()),
        family: Some(AddrFamily::V6),
        ..TcpOptions::default()
    })
    .unwrap();
    assert_eq!(net.local_ip(), ip);
    let (mut s, mut r) = pair(&net);
    roundtrip(&mut s, &mut r, 100_000, 9);
}

#[test]
fn many_in_flight_both_directions() {
    let net = net();
    let (mut s_ab, mut r_ab) = pair(&net);
    let (mut s_ba, mut r_ba) = pair(&net);
    // Much more than the socket buffers hold, mixed with tiny messages.
    let sizes: Vec<usize> = vec![
        3 << 20,
        0,
        1,
        5 << 20,
        7,
        4 << 20,
        12,
        2 << 20,
        65_537,
        6 << 20,
    ];
    let srcs: Vec<Vec<Vec<u8>>> = (0..2u8)
        .map(|d| {
            sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| pattern(n, d * 16 + i as u8))
                .collect()
        })
        .collect();
    let mut dsts: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|_| sizes.iter().map(|&n| vec![0u8; n]).collect())
        .collect();
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    // Post every send first (both directions), then every receive.
    for (d, s) in [&mut s_ab, &mut s_ba].into_iter().enumerate() {
        for (i, src) in srcs[d].iter().enumerate() {
            // SAFETY: `srcs` outlives the transfer, which `drive` completes.
            let req = unsafe { s.isend(src.as_ptr(), src.len(), i as u32, None) }
                .unwrap()
                .unwrap();
            sends.push((d, req));
        }
    }
    for (d, r) in [&mut r_ab, &mut r_ba].into_iter().enumerate() {
        for (i, dst) in dsts[d].iter_mut().enumerate() {
            // SAFETY: `dsts` outlives the transfer and is not touched meanwhile.
            let req = unsafe { r.irecv(dst.as_mut_ptr(), dst.len(), i as u32, None) }
                .unwrap()
                .unwrap();
            recvs.push((d, req));
        }
    }
    let got = drive(
        sends,
        recvs,
        &mut [&mut s_ab, &mut s_ba],
        &mut [&mut r_ab, &mut r_ba],
    );
    let expect: Vec<usize> = sizes.iter().chain(sizes.iter()).copied().collect();
    assert_eq!(got, expect);
    assert!(srcs == dsts, "payload corrupted");
}

#[test]
fn completion_can_be_tested_out_of_order() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    let a = pattern(1000, 1);
    let b = pattern(2000, 2);
    let mut da = vec![0u8; 1000];
    let mut db = vec![0u8; 4000];
    // SAFETY: all buffers outlive the transfers, which complete below.
    let (ra, rb) = unsafe {
        (
            r.irecv(da.as_mut_ptr(), da.len(), 5, None)
                .unwrap()
                .unwrap(),
            r.irecv(db.as_mut_ptr(), db.len(), 6, None)
                .unwrap()
                .unwrap(),
        )
    };
    // SAFETY: as above.
    let (sa, sb) = unsafe {
        (
            s.isend(a.as_ptr(), a.len(), 5, None).unwrap().unwrap(),
            s.isend(b.as_ptr(), b.len(), 6, None).unwrap().unwrap(),
        )
    };
    // Test the second requests first.
    let got = drive(
        vec![(0, sb), (0, sa)],
        vec![(0, rb), (0, ra)],
        &mut [&mut s],
        &mut [&mut r],
    );
    assert_eq!(got, [2000, 1000]);
    assert_eq!(da, a);
    assert_eq!(&db[..2000], &b[..]);
    // Reported requests are forgotten; unknown ones are errors.
    assert!(s.test(sa).is_err());
    assert!(r.test(rb).is_err());
    assert!(s.test(Request(12345)).is_err());
    assert!(r.test(Request(0)).is_err());
}

#[test]
fn request_limit() {
    let net = net();
    let (mut s, _r) = pair(&net);
    let buf = [0u8; 16];
    let mut reqs = Vec::new();
    for _ in 0..MAX_REQUESTS {
        // SAFETY: `buf` outlives the comm.
        reqs.push(
            unsafe { s.isend(buf.as_ptr(), buf.len(), 0, None) }
                .unwrap()
                .unwrap(),
        );
    }
    // SAFETY: as above.
    assert!(unsafe { s.isend(buf.as_ptr(), buf.len(), 0, None) }
        .unwrap()
        .is_none());
    // Small sends complete without the receiver polling (socket buffer).
    let start = Instant::now();
    while !s.test(reqs[0]).unwrap() {
        check_deadline(start, "first send");
    }
    // SAFETY: as above.
    assert!(unsafe { s.isend(buf.as_ptr(), buf.len(), 0, None) }
        .unwrap()
        .is_some());
}

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

#[test]
fn many_small_messages_pipelined() {
    let net = net();
    let (mut s, mut r) = pair(&net);
    let count = 2000usize;
    let size_of = |i: usize| (i * 37) % 301;
    let srcs: Vec<Vec<u8>> = (0..count).map(|i| pattern(size_of(i), i as u8)).collect();
    let mut dsts: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; 300]).collect();
    let (mut sreqs, mut rreqs) = (
        std::collections::VecDeque::new(),
        std::collections::VecDeque::new(),
    );
    let (mut next_send, mut next_recv, mut done) = (0, 0, 0);
    let start = Instant::now();
    while done < count {
        check_deadline(start, "small messages");
        // Keep up to half the request window in flight on each side.
        while next_send < count && sreqs.len() < MAX_REQUESTS / 2 {
            let src = &srcs[next_send];
            // SAFETY: `srcs` outlives the comm.
            let req = unsafe { s.isend(src.as_ptr(), src.len(), next_send as u32, None) };
            sreqs.push_back(req.unwrap().unwrap());
            next_send += 1;
        }
        while next_recv < count && rreqs.len() < MAX_REQUESTS / 2 {
            let dst = &mut dsts[next_recv];
            // SAFETY: `dsts` outlives the comm and each buffer is only read
            // after its request completed.
            let req = unsafe { r.irecv(dst.as_mut_ptr(), dst.len(), next_recv as u32, None) };
            rreqs.push_back((next_recv, req.unwrap().unwrap()));
            next_recv += 1;
        }
        while let Some(&req) = sreqs.front() {
            if !s.test(req).unwrap() {
                break;
            }
            sreqs.pop_front();
        }
        while let Some(&(i, req)) = rreqs.front() {
            let Some(n) = r.test(req).unwrap() else { break };
            assert_eq!(n, size_of(i));
            assert_eq!(&dsts[i][..n], &srcs[i][..], "message {i}");
            rreqs.pop_front();
            done += 1;
        }
    }
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
