//! What loopback TCP gives on this host with nothing of nccl-rs in between:
//! how long the kernel takes to carry one message from one process to
//! another, the reference for the TCP rows of the perf tools (not a strict
//! floor: a collective that receives into a small staging buffer can beat
//! a message received into one large buffer).
//!
//! ```text
//! tcp_floor [-b 1M] [-e 64M] [-f 4] [-n 0] [-s 3] [-c] [-m plain,zerocopy,splice,both]
//! ```
//! `-s` connections on 127.0.0.1 with `TCP_NODELAY` (3, as nccl-rs's
//! default data sockets), each message striped over them in contiguous
//! parts, both ends non-blocking and spinning while they wait (as a rank's
//! engine does, yielding after a while); the receiver (this program run as
//! `tcp_floor --receive <port> <bytes> <sockets> <check>`, a child process) reads
//! each message into one buffer and answers with one byte on the first
//! connection; a cell is the median time from the first byte sent to that
//! answer.
//! `-c` has each side check every byte it got (tests; not timed runs).
//! `-n 0` picks the repetitions per size (about 50 ms of sending per way).
//! The ways to send, one after the other at each size (interleaved
//! message by message, each disturbs the next: plain sends of 1 MiB took
//! 2–2.5 times longer between spliced and zero-copy ones):
//! * `plain`: `send`, the kernel copying the bytes into socket buffers
//!   (what nccl-rs, Open MPI and Gloo do over TCP);
//! * `zerocopy`: `MSG_ZEROCOPY` (`SO_ZEROCOPY`), the kernel pinning the
//!   sender's pages, each send completed through the socket's error queue;
//!   on loopback the kernel copies them anyway on delivery (the
//!   completions say so, counted as `copied`);
//! * `splice`: `vmsplice` of the sender's pages into a pipe of 1 MiB and
//!   `splice` from it into the socket, no copy on the sending side (what
//!   nccl-rs does for TCP messages of 256 KiB to 1 MiB from a rank that only
//!   sends);
//! * `both`: `plain` both ways at once: the receiver sends a message as
//!   long back while it receives, and the time runs to the last byte of
//!   that one.
//!
//! A broadcast of S bytes between two ranks moves what one `plain` message
//! of S moves, an all-gather or all-to-all of 2S what one `both` does;
//! compare its time with this one's taken in the same minute, since the
//! host's state moves both (see `copy_floor --pair`).

use nccl_perf::args::{size_arg as size, Sweep};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod lane;
use lane::Lane;

/// The longest any read or write of the connection may wait.
const IO_LIMIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Plain,
    ZeroCopy,
    Splice,
    Both,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Plain => "plain",
            Way::ZeroCopy => "zerocopy",
            Way::Splice => "splice",
            Way::Both => "both",
        }
    }
}

struct Args {
    sweep: Sweep,
    socks: usize,
    /// The receiver checks every byte of every message.
    check: bool,
    ways: Vec<Way>,
}

const USAGE: &str =
    "usage: tcp_floor [-b min] [-e max] [-f factor] [-n reps] [-s sockets] [-c] [-m plain,zerocopy,splice,both]";

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        sweep: Sweep {
            min: 1 << 20,
            max: 64 << 20,
            factor: 4,
            reps: 0,
        },
        socks: 3,
        check: false,
        ways: vec![Way::Plain, Way::ZeroCopy, Way::Splice, Way::Both],
    };
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            f if a.sweep.take(f, &mut value)? => {}
            "-s" => a.socks = size(&value()?)?,
            "-c" => a.check = true,
            "-m" => {
                a.ways = value()?
                    .split(',')
                    .map(|w| match w {
                        "plain" => Ok(Way::Plain),
                        "zerocopy" => Ok(Way::ZeroCopy),
                        "splice" => Ok(Way::Splice),
                        "both" => Ok(Way::Both),
                        _ => Err(format!("unknown way {w:?} (plain, zerocopy, splice, both)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    a.sweep.check()?;
    if a.ways.is_empty() || !(1..=64).contains(&a.socks) {
        return Err("need 1 to 64 sockets and at least one way".into());
    }
    Ok(a)
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Reads all of `buf` from a non-blocking stream, spinning while there is
/// nothing to read (as a rank's engine polls), within `IO_LIMIT`.
fn spin_read(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    exchange(&mut [s], &[], buf)
}

/// Writes all of `buf` to a non-blocking stream, spinning while its socket
/// buffer is full, within `IO_LIMIT`.
fn spin_write(s: &mut TcpStream, buf: &[u8]) -> std::io::Result<()> {
    exchange(&mut [s], buf, &mut [])
}

/// How a polling loop waits between passes: after a pass that moved
/// nothing, a spin for the first `SPINS` such passes in a row (as a rank's
/// engine polls), then a yield, so that on a host with fewer free CPUs
/// than spinners the other end runs; and no longer than `IO_LIMIT` since
/// the loop began.
struct Waiter {
    deadline: Instant,
    idle: u32,
}

impl Waiter {
    const SPINS: u32 = 2000;

    fn new() -> Self {
        Self {
            deadline: Instant::now() + IO_LIMIT,
            idle: 0,
        }
    }

    /// After one pass: on at once if it `moved`, else a short wait;
    /// `false` once the deadline has passed.
    fn after(&mut self, moved: bool) -> bool {
        if moved {
            self.idle = 0;
            return true;
        }
        if Instant::now() > self.deadline {
            return false;
        }
        if self.idle < Self::SPINS {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        self.idle = self.idle.saturating_add(1);
        true
    }
}

/// The byte at `i` of every message.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Where a message of `len` bytes striped over `n` sockets puts socket
/// `i`'s part (contiguous parts, as nccl-rs stripes).
fn part(len: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    len * i / n..len * (i + 1) / n
}

/// The receiving side: `socks` connections; reads a header on the first
/// (a length, 8 bytes little endian, 0 ends; 1 byte, 1 for `both`), then
/// that many bytes striped over all of them (and, for `both`, sends as
/// many back at once), then answers one byte on the first.
fn receive(port: u16, max: usize, socks: usize, check: bool) -> Result<(), String> {
    let mut ss = Vec::with_capacity(socks);
    for _ in 0..socks {
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        s.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        ss.push(s);
    }
    let mut buf = vec![1u8; max];
    let mine: Vec<u8> = (0..max).map(pattern).collect();
    loop {
        let mut header = [0u8; 9];
        spin_read(&mut ss[0], &mut header).map_err(|e| format!("header: {e}"))?;
        let len = u64::from_le_bytes(header[..8].try_into().unwrap_or_default()) as usize;
        if len == 0 {
            return Ok(());
        }
        let into = buf
            .get_mut(..len)
            .ok_or("a message longer than announced")?;
        exchange(
            &mut ss.iter_mut().collect::<Vec<_>>(),
            &mine[..len * usize::from(header[8])],
            into,
        )
        .map_err(|e| format!("payload: {e}"))?;
        if check {
            if let Some(i) = (0..len).find(|&i| into[i] != pattern(i)) {
                return Err(format!(
                    "byte {i} of a {len}-byte message: {} for {}",
                    into[i],
                    pattern(i)
                ));
            }
            into.fill(0);
        }
        if header[8] == 0 {
            spin_write(&mut ss[0], &[0]).map_err(|e| format!("answer: {e}"))?;
        }
    }
}

/// Sends `out` and receives `into` (either may be empty), each striped
/// over the non-blocking streams `ss` in contiguous parts, round robin,
/// spinning while nothing moves, within `IO_LIMIT`.
fn exchange(ss: &mut [&mut TcpStream], out: &[u8], into: &mut [u8]) -> std::io::Result<()> {
    let n = ss.len();
    let (mut sent, mut got) = (vec![0; n], vec![0; n]);
    let (out_len, in_len) = (out.len(), into.len());
    let mut waiter = Waiter::new();
    loop {
        let mut moved = false;
        let mut done = true;
        for (i, s) in ss.iter_mut().enumerate() {
            let o = &out[part(out_len, n, i)][sent[i]..];
            if !o.is_empty() {
                match s.write(o) {
                    Ok(k) => (sent[i], moved) = (sent[i] + k, true),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            let r = part(in_len, n, i);
            let want = r.len() - got[i];
            if want > 0 {
                match s.read(&mut into[r.start + got[i]..r.end]) {
                    Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Ok(k) => (got[i], moved) = (got[i] + k, true),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            done &= sent[i] == part(out_len, n, i).len() && got[i] == r.len();
        }
        if done {
            return Ok(());
        }
        if !waiter.after(moved) {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
    }
}

/// Sends `msg` one way, striped over `lanes`, and waits for the answer
/// (for `both`, for the message the receiver sends back into `back`).
fn send(lanes: &mut [Lane], way: Way, msg: &[u8], back: &mut [u8]) -> Result<(), String> {
    let mut header = [0u8; 9];
    header[..8].copy_from_slice(&(msg.len() as u64).to_le_bytes());
    header[8] = u8::from(way == Way::Both);
    spin_write(&mut lanes[0].sock, &header).map_err(|e| format!("header: {e}"))?;
    if way == Way::Both {
        let mut ss: Vec<&mut TcpStream> = lanes.iter_mut().map(|l| &mut l.sock).collect();
        return exchange(&mut ss, msg, &mut back[..msg.len()])
            .map_err(|e| format!("both ways: {e}"));
    }
    let n = lanes.len();
    for l in lanes.iter_mut() {
        l.at = 0;
    }
    let mut waiter = Waiter::new();
    loop {
        let mut moved = false;
        let mut done = true;
        for (i, l) in lanes.iter_mut().enumerate() {
            let p = &msg[part(msg.len(), n, i)];
            moved |= l.step(way, p)?;
            done &= l.done(p);
        }
        if done {
            break;
        }
        if !waiter.after(moved) {
            return Err(format!(
                "{} send: no progress within {IO_LIMIT:?}",
                way.name()
            ));
        }
    }
    let mut answer = [0u8; 1];
    spin_read(&mut lanes[0].sock, &mut answer).map_err(|e| format!("answer: {e}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The receiver's connection, or an error after `limit`.
fn accept_within(listener: &TcpListener, limit: Duration) -> Result<TcpStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + limit;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(true).map_err(|e| e.to_string())?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => return Err(format!("the receiver did not connect: {e}")),
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let mut child = Command::new(exe)
        .args([
            "--receive",
            &port.to_string(),
            &a.sweep.max.to_string(),
            &a.socks.to_string(),
        ])
        .arg(if a.check { "1" } else { "0" })
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("receiver: {e}"))?;
    let mut lanes = Vec::with_capacity(a.socks);
    for _ in 0..a.socks {
        lanes.push(Lane::new(accept_within(
            &listener,
            Duration::from_secs(10),
        )?)?);
    }
    let msg: Vec<u8> = (0..a.sweep.max).map(pattern).collect();
    let mut back = vec![0u8; a.sweep.max];
    println!(
        "# tcp_floor: {} loopback TCP socket(s) between two processes, messages striped; median per message",
        a.socks
    );
    print!("# {:>10}", "size");
    for w in &a.ways {
        print!(" {:>11}{:>8}", format!("{}(us)", w.name()), "GB/s");
    }
    println!();
    for s in a.sweep.sizes() {
        let reps = if a.sweep.reps > 0 {
            a.sweep.reps
        } else {
            (50_000_000 / s.max(1)).clamp(5, 200)
        };
        let mut times = vec![Vec::with_capacity(reps); a.ways.len()];
        for (k, &w) in a.ways.iter().enumerate() {
            for rep in 0..=reps {
                let t = Instant::now();
                send(&mut lanes, w, &msg[..s], &mut back)?;
                if a.check && w == Way::Both {
                    if let Some(i) = (0..s).find(|&i| back[i] != pattern(i)) {
                        return Err(format!("byte {i} of a {s}-byte message back: {}", back[i]));
                    }
                    back.fill(0);
                }
                if rep > 0 {
                    times[k].push(t.elapsed().as_secs_f64());
                }
            }
        }
        print!("  {s:>10}");
        for t in times {
            let m = median(t);
            print!(" {:>11.1}{:>8.2}", m * 1e6, s as f64 / m / 1e9);
        }
        println!();
    }
    if a.ways.contains(&Way::ZeroCopy) {
        let copied = lanes.iter().any(|l| l.zc_copied);
        println!("# zerocopy: the kernel copied the pages after all: {copied}");
    }
    spin_write(&mut lanes[0].sock, &[0; 9]).map_err(|e| format!("end: {e}"))?;
    let st = child.wait().map_err(|e| format!("receiver: {e}"))?;
    if !st.success() {
        return Err(format!("receiver ended {st}"));
    }
    Ok(())
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let r = match argv.first().map(String::as_str) {
        Some("--receive") => {
            let arg = |i: usize| argv.get(i).and_then(|v| v.parse::<usize>().ok());
            match (
                arg(1).and_then(|p| u16::try_from(p).ok()),
                arg(2),
                arg(3),
                arg(4),
            ) {
                (Some(port), Some(max), Some(socks), Some(check)) if socks > 0 => {
                    receive(port, max, socks, check == 1)
                }
                _ => Err("usage: tcp_floor --receive <port> <bytes> <sockets> <check>".into()),
            }
        }
        _ => parse(&argv).and_then(|a| run(&a)),
    };
    if let Err(e) = r {
        // One write: a server it started may share the terminal.
        let line = format!("tcp_floor: {e}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        std::process::exit(1);
    }
}
