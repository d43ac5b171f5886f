//! Connections of several sockets over loopback: striped messages of odd
//! sizes, many tags in flight both ways, helper threads, peers closing mid
//! stripe, mismatched socket counts and the striped wire format as a raw
//! peer writes it. Every poll loop runs under a deadline.

use nccl_net::{Net, NetError, RecvComm, Request, SendComm};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use transport_tcp::{TcpHandle, TcpNet, TcpOptions};
use wire::{inline_unit, piece_unit, striped_unit};

#[path = "common/conn.rs"]
mod conn;
#[path = "common/wire.rs"]
mod wire;

const DEADLINE: Duration = Duration::from_secs(60);
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn net(nsocks: usize, nthreads: usize) -> TcpNet {
    net_with(nsocks, nthreads, TcpOptions::default().socket_buf_bytes)
}

fn net_with(nsocks: usize, nthreads: usize, socket_buf_bytes: usize) -> TcpNet {
    let opts = TcpOptions {
        nsocks,
        nthreads,
        socket_buf_bytes,
        ..TcpOptions::default()
    };
    TcpNet::with_local_ip("127.0.0.1".parse().unwrap(), opts).unwrap()
}

fn check_deadline(start: Instant, what: &str) {
    assert!(start.elapsed() < DEADLINE, "timed out: {what}");
}

/// `rx` listens, `tx` connects; polls both until established.
fn pair(tx: &TcpNet, rx: &TcpNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    conn::pair(tx, rx, DEADLINE)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32) ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(2_654_435_761) as u8)
        .map(|b| b ^ seed as u8)
        .collect()
}

/// Sends `sizes` (tags 0..) from `s` to `r` with all requests in flight at
/// once, and checks every payload bit for bit and that nothing was written
/// past a message.
fn transfer(s: &mut dyn SendComm, r: &mut dyn RecvComm, sizes: &[usize], seed: u32) {
    let srcs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, seed + i as u32))
        .collect();
    let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xA5; n + 7]).collect();
    let mut rreqs = Vec::new();
    for (i, d) in dsts.iter_mut().enumerate() {
        // SAFETY: `dsts` outlives the transfer, read only after completion.
        let req = unsafe { r.irecv(d.as_mut_ptr(), d.len(), i as u32, None) };
        rreqs.push(req.unwrap().unwrap());
    }
    let mut sreqs = Vec::new();
    for (i, src) in srcs.iter().enumerate() {
        // SAFETY: `srcs` outlives the transfer.
        let req = unsafe { s.isend(src.as_ptr(), src.len(), i as u32, None) };
        sreqs.push(req.unwrap().unwrap());
    }
    let got = drive(&mut [(s, sreqs)], &mut [(r, rreqs)]);
    for (i, src) in srcs.iter().enumerate() {
        assert_eq!(got[0][i], src.len(), "size of message {i}");
        assert!(
            dsts[i][..src.len()] == src[..],
            "payload {i} ({} B)",
            src.len()
        );
        assert!(
            dsts[i][src.len()..].iter().all(|&b| b == 0xA5),
            "wrote past message {i}"
        );
    }
}

type Sends<'a> = (&'a mut dyn SendComm, Vec<Request>);
type Recvs<'a> = (&'a mut dyn RecvComm, Vec<Request>);

/// Tests every request in reverse posting order (completion order must not
/// matter) until all complete; returns the received sizes per comm.
fn drive(sends: &mut [Sends<'_>], recvs: &mut [Recvs<'_>]) -> Vec<Vec<usize>> {
    let mut sdone: Vec<Vec<bool>> = sends.iter().map(|(_, q)| vec![false; q.len()]).collect();
    let mut rdone: Vec<Vec<Option<usize>>> =
        recvs.iter().map(|(_, q)| vec![None; q.len()]).collect();
    let start = Instant::now();
    loop {
        check_deadline(start, "transfer");
        for (k, (s, q)) in sends.iter_mut().enumerate() {
            for (i, &req) in q.iter().enumerate().rev() {
                if !sdone[k][i] {
                    sdone[k][i] = s.test(req).unwrap();
                }
            }
        }
        for (k, (r, q)) in recvs.iter_mut().enumerate() {
            for (i, &req) in q.iter().enumerate().rev() {
                if rdone[k][i].is_none() {
                    rdone[k][i] = r.test(req).unwrap();
                }
            }
        }
        let all_sent = sdone.iter().flatten().all(|&d| d);
        if all_sent && rdone.iter().flatten().all(Option::is_some) {
            return rdone
                .into_iter()
                .map(|v| v.into_iter().map(Option::unwrap).collect())
                .collect();
        }
    }
}

const ODD_SIZES: [usize; 8] = [
    1,
    64 * KIB - 1,
    64 * KIB,
    64 * KIB + 1,
    MIB + 3,
    0,
    16 * MIB + 5,
    3 * 64 * KIB + 4095,
];

#[test]
fn odd_sizes_over_several_sockets_inline() {
    for n in [2, 3, 4, 8] {
        let net = net(n, 1);
        let (mut s, mut r) = pair(&net, &net);
        for (k, &len) in ODD_SIZES.iter().enumerate() {
            transfer(&mut *s, &mut *r, &[len], k as u32);
        }
        // All at once, so stripes of successive messages interleave.
        transfer(&mut *s, &mut *r, &ODD_SIZES, 99);
    }
}

#[test]
fn odd_sizes_with_helper_threads() {
    for (n, t) in [(2, 2), (4, 2), (8, 4), (3, 8)] {
        let net = net(n, t);
        let (mut s, mut r) = pair(&net, &net);
        for (k, &len) in ODD_SIZES.iter().enumerate() {
            transfer(&mut *s, &mut *r, &[len], k as u32);
        }
        transfer(&mut *s, &mut *r, &ODD_SIZES, 7);
    }
}

/// Two connections, one each way, each with many tags in flight; one side
/// uses helper threads, the other does not.
#[test]
fn many_tags_in_flight_both_directions() {
    let a = net(4, 2);
    let b = net(4, 1);
    let (mut ab_s, mut ab_r) = pair(&a, &b);
    let (mut ba_s, mut ba_r) = pair(&b, &a);
    let sizes: Vec<usize> = (0..24)
        .map(|i| match i % 4 {
            0 => 8,
            1 => 300 * KIB + i,
            2 => 64 * KIB + 1,
            _ => 2 * MIB + 3 * i,
        })
        .collect();
    let mk = |seed: u32| -> Vec<Vec<u8>> {
        (0..sizes.len())
            .map(|i| pattern(sizes[i], seed + i as u32))
            .collect()
    };
    let (src_ab, src_ba) = (mk(1000), mk(2000));
    let mut dst_ab: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
    let mut dst_ba: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
    let tag = |i: usize| 0x1000 + i as u32;
    let (mut rq_ab, mut rq_ba, mut sq_ab, mut sq_ba) = (vec![], vec![], vec![], vec![]);
    for i in 0..sizes.len() {
        // SAFETY: every buffer outlives the comms' use of it (`drive`
        // completes all requests before the buffers are read or dropped).
        unsafe {
            rq_ab.push(ab_r.irecv(dst_ab[i].as_mut_ptr(), sizes[i], tag(i), None));
            rq_ba.push(ba_r.irecv(dst_ba[i].as_mut_ptr(), sizes[i], tag(i), None));
            sq_ab.push(ab_s.isend(src_ab[i].as_ptr(), sizes[i], tag(i), None));
            sq_ba.push(ba_s.isend(src_ba[i].as_ptr(), sizes[i], tag(i), None));
        }
    }
    let un = |v: Vec<nccl_net::NetResult<Option<Request>>>| -> Vec<Request> {
        v.into_iter().map(|r| r.unwrap().unwrap()).collect()
    };
    let got = drive(
        &mut [(&mut *ab_s, un(sq_ab)), (&mut *ba_s, un(sq_ba))],
        &mut [(&mut *ab_r, un(rq_ab)), (&mut *ba_r, un(rq_ba))],
    );
    assert_eq!(got, [sizes.clone(), sizes.clone()]);
    for i in 0..sizes.len() {
        assert!(dst_ab[i] == src_ab[i], "a->b message {i}");
        assert!(dst_ba[i] == src_ba[i], "b->a message {i}");
    }
}

/// The connector always adopts the listener's socket count.
#[test]
fn mismatched_socket_counts_use_the_listeners() {
    for (tx_n, rx_n) in [(1, 4), (4, 1), (2, 8), (8, 3)] {
        let (tx, rx) = (net(tx_n, 1), net(rx_n, 2));
        let h = TcpHandle::decode(rx.listen().unwrap().handle()).unwrap();
        assert_eq!(usize::from(h.nsocks), rx_n);
        let (mut s, mut r) = pair(&tx, &rx);
        transfer(
            &mut *s,
            &mut *r,
            &[5, MIB + 3, 64 * KIB + 1, 8],
            tx_n as u32,
        );
    }
}

/// Posts a 16 MiB + 5 send over 4 data sockets with small kernel buffers,
/// lets the receiver take part of it, then closes one side; the other, which
/// uses `nthreads` helper threads, must fail with an error, not hang or
/// report success. The closing side has no helpers, so nothing moves on its
/// end unless it is tested.
fn close_mid_stripe(nthreads: usize, close_sender: bool) {
    let (tx_threads, rx_threads) = if close_sender {
        (1, nthreads)
    } else {
        (nthreads, 1)
    };
    let tx = net_with(4, tx_threads, 64 * KIB);
    let rx = net_with(4, rx_threads, 64 * KIB);
    let (mut s, mut r) = pair(&tx, &rx);
    let len = 16 * MIB + 5;
    let src = pattern(len, 5);
    let mut dst = vec![0u8; len];
    // SAFETY: both buffers outlive both comms (dropped at the end).
    let rr = unsafe { r.irecv(dst.as_mut_ptr(), len, 3, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sr = unsafe { s.isend(src.as_ptr(), len, 3, None) }
        .unwrap()
        .unwrap();
    // The receiver has not read the header yet, so nothing is taken off the
    // data sockets: 16 MiB does not fit 4 pairs of 64 KiB socket buffers
    // (doubled by the kernel).
    for _ in 0..10 {
        assert!(!s.test(sr).unwrap(), "sent 16 MiB without a reader");
    }
    if close_sender {
        // The receiver starts taking pieces; the untested sender cannot
        // refill its sockets, so the receive cannot complete.
        assert!(r.test(rr).unwrap().is_none(), "received 16 MiB in one poll");
    }
    let start = Instant::now();
    let err = if close_sender {
        drop(s);
        loop {
            check_deadline(start, "receiver error after sender closed");
            match r.test(rr) {
                Ok(None) => {}
                Ok(Some(n)) => panic!("receive of {n} bytes completed"),
                Err(e) => break e,
            }
        }
    } else {
        drop(r);
        loop {
            check_deadline(start, "sender error after receiver closed");
            match s.test(sr) {
                Ok(false) => {}
                Ok(true) => panic!("send completed to a closed peer"),
                Err(e) => break e,
            }
        }
    };
    assert!(
        matches!(&err, NetError::Closed(_) | NetError::Io { .. }),
        "{err}"
    );
}

#[test]
fn sender_closes_mid_stripe() {
    close_mid_stripe(1, true);
    close_mid_stripe(2, true);
}

#[test]
fn receiver_closes_mid_stripe() {
    close_mid_stripe(1, false);
    close_mid_stripe(4, false);
}

fn connect_raw(h: &TcpHandle, hello: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(hello).unwrap();
    s
}

fn accept_until(l: &mut Box<dyn nccl_net::Listener>, what: &str) -> Box<dyn RecvComm> {
    let start = Instant::now();
    loop {
        check_deadline(start, what);
        if let Some(r) = l.accept().unwrap() {
            return r;
        }
    }
}

fn is_closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

/// A raw peer of a listener with 2 data sockets (3 TCP sockets): greetings
/// with a wrong socket count
/// or a duplicate index are dropped; then it writes a striped message by
/// the documented layout and the receiver reassembles it exactly.
#[test]
fn raw_peer_greetings_and_striped_wire_format() {
    let rx = net(2, 1);
    let mut l = rx.listen().unwrap();
    let h = TcpHandle::decode(l.handle()).unwrap();
    assert_eq!(h.nsocks, 2);
    let mut wrong_count = h.hello_for(0);
    wrong_count[6] = 3;
    let mut bad_count = connect_raw(&h, &wrong_count);
    let mut bad_index = connect_raw(&h, &h.hello_for(3));
    let mut s0 = connect_raw(&h, &h.hello_for(0));
    // Let the listener take socket 0 before its duplicate arrives.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(100) {
        assert!(l.accept().unwrap().is_none(), "accepted with one socket");
    }
    let mut dup = connect_raw(&h, &h.hello_for(0));
    while start.elapsed() < Duration::from_millis(200) {
        assert!(l.accept().unwrap().is_none(), "accepted with one socket");
    }
    let mut s1 = connect_raw(&h, &h.hello_for(1));
    while start.elapsed() < Duration::from_millis(300) {
        assert!(l.accept().unwrap().is_none(), "accepted with two sockets");
    }
    let mut s2 = connect_raw(&h, &h.hello_for(2));
    let mut r = accept_until(&mut l, "raw 2-socket peer");
    for s in [&mut bad_count, &mut bad_index, &mut dup] {
        assert!(is_closed(s), "bad greeting not dropped");
    }
    // Socket 0 carries the headers. 200000 bytes over 2 data sockets:
    // pieces of ceil(200000 / 2) rounded up to 4 KiB = 102400 bytes, the
    // first on socket 1, the second on socket 2. Then an 8-byte message
    // inline on socket 0, then 150000 bytes (77824 + 72176) starting at
    // socket 1 again (the rotation is back at 0). Each message claims its
    // own alignment; every write is whole 64-byte units.
    let (a, b, c) = (pattern(200_000, 1), pattern(8, 2), pattern(150_000, 3));
    let (al_a, al_b, al_c) = (16, 0, 63);
    let mut dsts = [vec![0u8; 200_000], vec![0u8; 8], vec![0u8; 150_000]];
    let mut reqs = Vec::new();
    for (i, d) in dsts.iter_mut().enumerate() {
        // SAFETY: `dsts` outlives `r`'s use; read only after completion.
        reqs.push(
            unsafe { r.irecv(d.as_mut_ptr(), d.len(), 40 + i as u32, None) }
                .unwrap()
                .unwrap(),
        );
    }
    s2.write_all(&piece_unit(&a[102_400..], al_a)).unwrap();
    s2.write_all(&piece_unit(&c[77_824..], al_c)).unwrap();
    s1.write_all(&piece_unit(&a[..102_400], al_a)).unwrap();
    s1.write_all(&piece_unit(&c[..77_824], al_c)).unwrap();
    s0.write_all(&striped_unit(40, a.len(), al_a)).unwrap();
    s0.write_all(&inline_unit(41, &b, al_b)).unwrap();
    s0.write_all(&striped_unit(42, c.len(), al_c)).unwrap();
    let got = drive(&mut [] as &mut [Sends<'_>], &mut [(&mut *r, reqs)]);
    assert_eq!(got, [vec![200_000, 8, 150_000]]);
    assert!(dsts[0] == a && dsts[1] == b && dsts[2] == c);
}
