//! Two rails between two network namespaces (root only): `nrail0` and
//! `nrail1` joined by two veth pairs, `rail0` (10.76.0.1 / 10.76.0.2) and
//! `rail1` (10.76.1.1 / 10.76.1.2), IPv6 off so nothing but the test's own
//! traffic crosses them. A sender in `nrail0` moves 64 MiB to a receiver in
//! `nrail1`; the payload must arrive bit for bit and the interfaces' byte
//! counters (read inside the namespaces) must show where it went:
//! * `NCCL_SOCKET_IFNAME=rail` at both ends: each rail carries at least
//!   40% of the payload;
//! * `=rail0` at both ends, or `rail` at the sender and `=rail0` at the
//!   receiver (the rail counts differ): rail 1 carries nothing.
//!
//! One test thread does all of it: it enters `nrail1` (`setns`) to make the
//! receiver's net and listener, then `nrail0` for the sender's; sockets
//! stay in the namespace they were made in, so it then polls both ends.

use nccl_net::{Net, RecvComm, Request, SendComm};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};
use transport_tcp::{TcpNet, TcpOptions};

const DEADLINE: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;
/// Payload per run: 8 messages of 8 MiB.
const MESSAGES: usize = 8;
const MESSAGE_BYTES: usize = 8 * MIB;
const NS: [&str; 2] = ["nrail0", "nrail1"];

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Deletes the namespaces (and with them the veth pairs) when dropped.
struct Namespaces;

impl Namespaces {
    fn create() -> Namespaces {
        for ns in NS {
            // Left over from an interrupted run.
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let guard = Namespaces;
        for ns in NS {
            ip(&["netns", "add", ns]);
            for key in ["all", "default"] {
                let sysctl = format!("net.ipv6.conf.{key}.disable_ipv6=1");
                ip(&["netns", "exec", ns, "sysctl", "-qw", &sysctl]);
            }
        }
        for r in 0..2 {
            let name = format!("rail{r}");
            ip(&[
                "link", "add", &name, "netns", NS[0], "type", "veth", "peer", "name", &name,
                "netns", NS[1],
            ]);
            for (host, ns) in NS.iter().enumerate() {
                let addr = format!("10.76.{r}.{}/24", host + 1);
                ip(&["-n", ns, "addr", "add", &addr, "dev", &name]);
                ip(&["-n", ns, "link", "set", &name, "up"]);
            }
        }
        for ns in NS {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        guard
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in NS {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Bytes `rail` of namespace `ns` has sent, from sysfs as the namespace
/// sees it.
fn tx_bytes(ns: &str, rail: usize) -> u64 {
    let path = format!("/sys/class/net/rail{rail}/statistics/tx_bytes");
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", &path])
        .output()
        .unwrap();
    assert!(out.status.success(), "{ns} {path}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Moves this thread into network namespace `ns`.
fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    // SAFETY: `f` is an open namespace file; setns only changes this
    // thread's network namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

fn net(ifname: &str) -> TcpNet {
    let net = TcpNet::new(TcpOptions {
        ifname: Some(ifname.into()),
        ..TcpOptions::default()
    })
    .unwrap();
    // By default, one data socket per rail over network interfaces.
    assert_eq!(net.options().nsocks, 1, "{ifname}");
    net
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32) ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(2_654_435_761) as u8)
        .collect()
}

/// In its own thread: a receiver in `nrail1` selecting `rx_if`, a sender in
/// `nrail0` selecting `tx_if`; moves the payload and checks it. Returns the
/// rail counts of the two nets.
fn run(tx_if: &'static str, rx_if: &'static str) -> (usize, usize) {
    std::thread::spawn(move || {
        enter(NS[1]);
        let rx = net(rx_if);
        let mut listener = rx.listen().unwrap();
        enter(NS[0]);
        let tx = net(tx_if);
        let mut connector = tx.connect(listener.handle()).unwrap();
        let mut s: Option<Box<dyn SendComm>> = None;
        let mut r: Option<Box<dyn RecvComm>> = None;
        let start = Instant::now();
        while s.is_none() || r.is_none() {
            assert!(start.elapsed() < DEADLINE, "timed out: handshake");
            if s.is_none() {
                s = connector.poll_connect().unwrap();
            }
            if r.is_none() {
                r = listener.accept().unwrap();
            }
        }
        let (mut s, mut r) = (s.unwrap(), r.unwrap());
        let srcs: Vec<Vec<u8>> = (0..MESSAGES)
            .map(|i| pattern(MESSAGE_BYTES, i as u32 + 1))
            .collect();
        let mut dsts = vec![vec![0u8; MESSAGE_BYTES]; MESSAGES];
        let mut rreqs: Vec<Request> = Vec::new();
        for (i, d) in dsts.iter_mut().enumerate() {
            // SAFETY: `dsts` outlives the requests, read after completion.
            let q = unsafe { r.irecv(d.as_mut_ptr(), d.len(), i as u32, None) };
            rreqs.push(q.unwrap().unwrap());
        }
        let mut sreqs: Vec<Request> = Vec::new();
        for (i, src) in srcs.iter().enumerate() {
            // SAFETY: `srcs` outlives the requests.
            let q = unsafe { s.isend(src.as_ptr(), src.len(), i as u32, None) };
            sreqs.push(q.unwrap().unwrap());
        }
        let mut sent = [false; MESSAGES];
        let mut got = [None; MESSAGES];
        let start = Instant::now();
        while sent.iter().any(|d| !d) || got.iter().any(Option::is_none) {
            assert!(start.elapsed() < DEADLINE, "timed out: transfer");
            for i in 0..MESSAGES {
                if !sent[i] {
                    sent[i] = s.test(sreqs[i]).unwrap();
                }
                if got[i].is_none() {
                    got[i] = r.test(rreqs[i]).unwrap();
                }
            }
        }
        for i in 0..MESSAGES {
            assert_eq!(got[i], Some(MESSAGE_BYTES), "size of message {i}");
            assert!(dsts[i] == srcs[i], "payload of message {i}");
        }
        (tx.rails().len(), rx.rails().len())
    })
    .join()
    .unwrap()
}

/// Bytes each rail of each namespace sent during `f`.
fn counted(f: impl FnOnce() -> (usize, usize)) -> ((usize, usize), [[u64; 2]; 2]) {
    let before = NS.map(|ns| [0, 1].map(|r| tx_bytes(ns, r)));
    let rails = f();
    let after = NS.map(|ns| [0, 1].map(|r| tx_bytes(ns, r)));
    let mut d = [[0u64; 2]; 2];
    for h in 0..2 {
        for r in 0..2 {
            d[h][r] = after[h][r] - before[h][r];
        }
    }
    eprintln!(
        "rails {rails:?}: bytes sent per rail, {}: {:?}, {}: {:?}",
        NS[0], d[0], NS[1], d[1]
    );
    (rails, d)
}

#[test]
fn two_rails_carry_equal_shares() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: creating network namespaces needs root");
        return;
    }
    let _ns = Namespaces::create();
    let payload = (MESSAGES * MESSAGE_BYTES) as u64;

    // One rail selected at both ends: rail 1 stays silent both ways.
    let (rails, d) = counted(|| run("=rail0", "=rail0"));
    assert_eq!(rails, (1, 1));
    assert!(d[0][0] >= payload, "rail 0 sent {} of {payload}", d[0][0]);
    assert_eq!([d[0][1], d[1][1]], [0, 0], "rail 1 carried traffic");

    // Two rails at the sender, one at the receiver: one rail used.
    let (rails, d) = counted(|| run("rail", "=rail0"));
    assert_eq!(rails, (2, 1));
    assert!(d[0][0] >= payload, "rail 0 sent {} of {payload}", d[0][0]);
    assert_eq!([d[0][1], d[1][1]], [0, 0], "rail 1 carried traffic");

    // Two rails at both ends: each carries at least 40% of the payload.
    let (rails, d) = counted(|| run("rail", "rail"));
    assert_eq!(rails, (2, 2));
    for (r, &b) in d[0].iter().enumerate() {
        assert!(
            b * 10 >= payload * 4,
            "rail {r} sent {b} of {payload} bytes ({:?})",
            d[0]
        );
    }
}
