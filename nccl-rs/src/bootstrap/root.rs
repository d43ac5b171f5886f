//! The bootstrap root: a thread in rank 0's process that admits ranks that
//! prove they know the unique id's secret, then hands them to the monitor
//! (`monitor.rs`).
//!
//! Strangers — wrong secret, garbage, oversized or truncated frames, slow
//! trickles — are dropped with a WARN line. Each costs at most one hello's
//! worth of memory and [`HELLO_DEADLINE`] of time, and at most
//! [`MAX_PENDING`] are held at once, so they cannot disturb the job.

use super::wire::{secrets_equal, write_frame, Hello, HELLO_LEN};
use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Marks the root finished (and forgets it) when its thread ends.
struct Finish(Done, Option<SocketAddr>);

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some(addr) = self.1 {
            running()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&addr);
        }
        set_remaining(&self.0, 0);
    }
}
use tracing::{debug, warn};

/// How long an unauthenticated connection may take to send its hello.
pub(crate) const HELLO_DEADLINE: Duration = Duration::from_secs(5);
/// Most unauthenticated connections held at once.
pub(crate) const MAX_PENDING: usize = 256;
/// Most connections accepted before pending hellos are read again.
const ACCEPT_BATCH: usize = 16;

struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    buf: Vec<u8>,
    since: Instant,
}

/// How many ranks are still connected to a root (`usize::MAX` before all
/// joined, 0 when it finished), shared with waiters in this process.
pub(crate) type Done = Arc<(Mutex<usize>, Condvar)>;

/// Live rank clients in this process, per root address.
fn local_clients() -> &'static Mutex<HashMap<SocketAddr, usize>> {
    static LOCAL: OnceLock<Mutex<HashMap<SocketAddr, usize>>> = OnceLock::new();
    LOCAL.get_or_init(Default::default)
}

/// Counts a rank client of the root at `addr` in this process (`delta` ±1).
pub(crate) fn count_local_client(addr: SocketAddr, delta: isize) {
    let mut m = local_clients().lock().unwrap_or_else(|p| p.into_inner());
    let c = m.entry(addr).or_insert(0);
    *c = c.saturating_add_signed(delta);
    if *c == 0 {
        m.remove(&addr);
    }
    drop(m);
    if let Some(done) = running()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&addr)
    {
        done.1.notify_all();
    }
}

/// Publishes how many ranks are still connected.
pub(crate) fn set_remaining(done: &Done, n: usize) {
    let mut g = done.0.lock().unwrap_or_else(|p| p.into_inner());
    if *g != n {
        *g = n;
        done.1.notify_all();
    }
}

/// Roots running in this process, by address, with their "finished" flags.
fn running() -> &'static Mutex<HashMap<SocketAddr, Done>> {
    static ROOTS: OnceLock<Mutex<HashMap<SocketAddr, Done>>> = OnceLock::new();
    ROOTS.get_or_init(Default::default)
}

/// If the root at `addr` runs in this process, waits (at most `timeout`)
/// until every rank of other processes has left it, so that ranks still
/// finishing their last operation keep their health channel when this
/// process exits. Ranks in this process (threads) are not waited for: they
/// keep the process alive themselves.
pub(crate) fn wait_finished(addr: SocketAddr, timeout: Duration) {
    let Some(done) = running()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&addr)
        .cloned()
    else {
        return;
    };
    let (remaining, cv) = &*done;
    let local = || {
        local_clients()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .copied()
            .unwrap_or(0)
    };
    let deadline = Instant::now() + timeout;
    let mut g = remaining.lock().unwrap_or_else(|p| p.into_inner());
    while *g != usize::MAX && *g > local() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        g = cv
            .wait_timeout(g, left.min(Duration::from_millis(50)))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Starts the root thread on `listener`.
pub(crate) fn spawn(
    listener: TcpListener,
    secret: [u8; 16],
    timeout: Duration,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let done: Done = Arc::new((Mutex::new(usize::MAX), Condvar::new()));
    if let Ok(addr) = listener.local_addr() {
        running()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, done.clone());
    }
    std::thread::Builder::new()
        .name("nccl-bootstrap-root".into())
        .spawn(move || {
            let _finish = Finish(done.clone(), listener.local_addr().ok());
            let addr = listener.local_addr().ok();
            match admit(&listener, &secret, timeout) {
                Some(ranks) => {
                    drop(listener);
                    super::monitor::serve(ranks, &done);
                }
                None => warn!(
                    ?addr,
                    "bootstrap root: not every rank joined within {timeout:?}; giving up"
                ),
            }
        })?;
    Ok(())
}

/// Accepts connections until every rank has joined; `None` on timeout.
fn admit(listener: &TcpListener, secret: &[u8; 16], timeout: Duration) -> Option<Vec<TcpStream>> {
    let deadline = Instant::now() + timeout;
    let mut ranks: Vec<Option<TcpStream>> = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        if !ranks.is_empty() && ranks.iter().all(Option::is_some) {
            return Some(ranks.into_iter().map(|s| s.expect("all joined")).collect());
        }
        if Instant::now() > deadline {
            return None;
        }
        let mut moved = false;
        // Accept a bounded batch, then serve reads, so a flood of idle
        // connections cannot starve the ranks' hellos. A new connection is
        // read at once: a rank's hello is usually already there, so it joins
        // before any eviction can pick it.
        for _ in 0..ACCEPT_BATCH {
            let Ok((stream, peer)) = listener.accept() else {
                break;
            };
            moved = true;
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let mut p = Pending {
                stream,
                peer,
                buf: Vec::with_capacity(4 + HELLO_LEN),
                since: Instant::now(),
            };
            match read_hello(&mut p) {
                Ok(Some(hello)) => {
                    if let Err(why) = join(&mut ranks, p.stream, &hello, secret) {
                        warn!(peer = %p.peer, rank = hello.rank, "bootstrap root: refusing: {why}");
                    }
                    continue;
                }
                Err(why) => {
                    warn!(peer = %p.peer, "bootstrap root: dropping a connection: {why}");
                    continue;
                }
                Ok(None) => {}
            }
            if pending.len() >= MAX_PENDING {
                // Evict the connection that has shown the least: the oldest
                // of those with the fewest bytes.
                let least = pending.iter().map(|p| p.buf.len()).min().unwrap_or(0);
                let victim = pending
                    .iter()
                    .position(|p| p.buf.len() == least)
                    .unwrap_or(0);
                let old = pending.remove(victim);
                warn!(peer = %old.peer, "bootstrap root: dropping an unauthenticated connection (too many pending)");
            }
            pending.push(p);
        }
        let mut i = 0;
        while i < pending.len() {
            match read_hello(&mut pending[i]) {
                Ok(None) if pending[i].since.elapsed() < HELLO_DEADLINE => i += 1,
                Ok(None) => {
                    let p = pending.swap_remove(i);
                    warn!(peer = %p.peer, "bootstrap root: dropping a connection that sent no hello within {HELLO_DEADLINE:?}");
                }
                Err(why) => {
                    let p = pending.swap_remove(i);
                    warn!(peer = %p.peer, "bootstrap root: dropping a connection: {why}");
                    moved = true;
                }
                Ok(Some(hello)) => {
                    let p = pending.swap_remove(i);
                    if let Err(why) = join(&mut ranks, p.stream, &hello, secret) {
                        warn!(peer = %p.peer, rank = hello.rank, "bootstrap root: refusing: {why}");
                    } else {
                        debug!(peer = %p.peer, rank = hello.rank, "bootstrap root: rank joined");
                    }
                    moved = true;
                }
            }
        }
        if !moved {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Reads what is available of a hello frame; `Ok(Some)` once complete.
fn read_hello(p: &mut Pending) -> Result<Option<Hello>, String> {
    let want = 4 + HELLO_LEN;
    let mut tmp = [0u8; 64];
    while p.buf.len() < want {
        let room = (want - p.buf.len()).min(tmp.len());
        match p.stream.read(&mut tmp[..room]) {
            Ok(0) => return Err("closed before finishing its hello".into()),
            Ok(n) => p.buf.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
        if p.buf.len() >= 4 {
            let len = u32::from_le_bytes(p.buf[..4].try_into().expect("4 bytes")) as usize;
            if len != HELLO_LEN {
                return Err(format!("not a hello (frame length {len})"));
            }
        }
    }
    Hello::decode(&p.buf[4..]).map(Some)
}

fn join(
    ranks: &mut Vec<Option<TcpStream>>,
    mut stream: TcpStream,
    h: &Hello,
    secret: &[u8; 16],
) -> Result<(), String> {
    if !secrets_equal(&h.secret, secret) {
        return Err("wrong secret (not part of this job)".into());
    }
    let reply = |s: &mut TcpStream, msg: &[u8]| {
        s.set_nonblocking(false)
            .and_then(|_| s.set_write_timeout(Some(HELLO_DEADLINE)))
            .and_then(|_| write_frame(s, msg))
    };
    let problem = if h.nranks == 0 || h.rank >= h.nranks {
        Some(format!("rank {} of {} is out of range", h.rank, h.nranks))
    } else if !ranks.is_empty() && ranks.len() != h.nranks as usize {
        Some(format!(
            "rank {} says the job has {} ranks; others said {}",
            h.rank,
            h.nranks,
            ranks.len()
        ))
    } else if ranks.get(h.rank as usize).is_some_and(Option::is_some) {
        Some(format!("rank {} joined twice", h.rank))
    } else {
        None
    };
    if let Some(why) = problem {
        let _ = reply(&mut stream, format!("ERR {why}").as_bytes());
        return Err(why);
    }
    if ranks.is_empty() {
        ranks.resize_with(h.nranks as usize, || None);
    }
    reply(&mut stream, b"OK").map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    ranks[h.rank as usize] = Some(stream);
    Ok(())
}
