//! Messages that arrive intact: sizes from 0 bytes to 64 MiB, IPv6, many
//! in flight both ways, out-of-order completion tests, the request window.

use super::{check_deadline, drive, net, pair, pattern, roundtrip};
use nccl_net::Request;
use std::net::IpAddr;
use std::time::Instant;
use transport_tcp::{AddrFamily, TcpNet, TcpOptions, MAX_REQUESTS};

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
fn kernel_autotuned_buffers() {
    // `socket_buf_bytes: 0` (`NCCL_RS_SOCKET_BUF_BYTES=0`) sets no buffer sizes:
    // the kernel's autotuning; data still arrives intact, striped or not.
    let net = TcpNet::with_local_ip(
        "127.0.0.1".parse().unwrap(),
        TcpOptions {
            socket_buf_bytes: 0,
            ..TcpOptions::default()
        },
    )
    .unwrap();
    let (mut s, mut r) = pair(&net);
    for (i, len) in [0usize, 13, 100_000, 8 << 20].into_iter().enumerate() {
        roundtrip(&mut s, &mut r, len, i as u32);
    }
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
