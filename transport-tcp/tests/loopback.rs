//! The TCP transport over loopback: handshake, data path, errors, strays.
//! Every poll loop runs under a deadline so nothing can hang.

#[path = "loopback/data_path.rs"]
mod data_path;
#[path = "loopback/errors.rs"]
mod errors;
#[path = "loopback/raw_peers.rs"]
mod raw_peers;
#[path = "common/wire.rs"]
mod wire;

use nccl_net::{RecvComm, Request, SendComm};
use std::time::{Duration, Instant};
use transport_tcp::{TcpNet, TcpOptions};

#[path = "common/conn.rs"]
mod conn;
const DEADLINE: Duration = Duration::from_secs(20);

/// One socket per connection: the raw peers (in `loopback/raw_peers.rs`) speak that wire format
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
    conn::pair(net, net, DEADLINE)
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
