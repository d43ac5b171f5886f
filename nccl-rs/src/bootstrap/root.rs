//! The bootstrap root: a thread in rank 0's process that admits the job's
//! ranks (the rules are in `admission.rs`; this file does the socket I/O),
//! then hands them to the monitor (`monitor.rs`).
//!
//! Strangers — wrong secret, garbage, oversized or truncated frames, slow
//! trickles, hostile counts — are dropped. Each costs at most one hello's
//! worth of memory and `HELLO_DEADLINE` of time, at most `MAX_PENDING`
//! are held at once (`admission.rs`), and their WARN lines are rate-limited, so they cannot
//! disturb the job or flood its log.

use super::admission::{Action, Admission, Key, HELLO_DEADLINE};
use super::wire::write_frame;
use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Most connections accepted before open ones are read again.
const ACCEPT_BATCH: usize = 16;
/// WARN lines about refused or dropped connections printed one by one
/// before they are only counted (a flood must not flood the log).
const WARN_BURST: u32 = 8;
/// How often the count of unprinted refusals is printed.
const WARN_SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// What a root shares with the ranks of its process.
#[derive(Default)]
pub(crate) struct RootShared {
    state: Mutex<RootState>,
    cv: Condvar,
}

struct RootState {
    /// Ranks still connected (`usize::MAX` before all joined, 0 finished).
    remaining: usize,
    /// The job failed and every rank was told: nobody is worth waiting for.
    aborted: bool,
    /// Admission failed (a rank was claimed twice): the root only refuses.
    refused: bool,
    /// The job size a rank of this process announced.
    size: Option<usize>,
}

impl Default for RootState {
    fn default() -> Self {
        RootState {
            remaining: usize::MAX,
            aborted: false,
            refused: false,
            size: None,
        }
    }
}

/// A root's shared state.
pub(crate) type Done = Arc<RootShared>;

impl RootShared {
    fn lock(&self) -> MutexGuard<'_, RootState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits while `wait(state)` holds, at most `timeout`.
    fn wait_while(&self, timeout: Duration, wait: impl Fn(&RootState) -> bool) {
        let deadline = Instant::now() + timeout;
        let mut g = self.lock();
        while wait(&g) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            // Bounded slices: `local` counts change without a notify.
            g = self
                .cv
                .wait_timeout(g, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

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

/// Live rank clients in this process, per root address.
fn local_clients() -> &'static Mutex<HashMap<SocketAddr, usize>> {
    static LOCAL: OnceLock<Mutex<HashMap<SocketAddr, usize>>> = OnceLock::new();
    LOCAL.get_or_init(Default::default)
}

/// The root at `addr`, if it runs in this process.
fn local_root(addr: SocketAddr) -> Option<Done> {
    running()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&addr)
        .cloned()
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
    if let Some(done) = local_root(addr) {
        done.cv.notify_all();
    }
}

/// A rank of this process joins the root at `addr` (if it runs here) as
/// part of a job of `nranks`: the root takes that as the job size, since
/// this process is the one that started it (rank 0's).
pub(crate) fn announce_size(addr: SocketAddr, nranks: usize) {
    if let Some(done) = local_root(addr) {
        let mut g = done.lock();
        if g.size.is_none() {
            g.size = Some(nranks);
        }
    }
}

/// If the root at `addr` runs in this process and refused the job, waits
/// (at most `timeout`) for its thread to end, so that the ranks of other
/// processes still hear the refusal from it rather than finding the port
/// closed when this process exits.
pub(crate) fn wait_ended(addr: SocketAddr, timeout: Duration) {
    if let Some(done) = local_root(addr) {
        done.wait_while(timeout, |g| g.refused && g.remaining != 0);
    }
}

/// Publishes how many ranks are still connected.
pub(crate) fn set_remaining(done: &Done, n: usize) {
    let mut g = done.lock();
    if g.remaining != n {
        g.remaining = n;
        done.cv.notify_all();
    }
}

/// The job was aborted and every rank told: waiters stop waiting.
pub(crate) fn set_aborted(done: &Done) {
    done.lock().aborted = true;
    done.cv.notify_all();
}

/// Roots running in this process, by address.
fn running() -> &'static Mutex<HashMap<SocketAddr, Done>> {
    static ROOTS: OnceLock<Mutex<HashMap<SocketAddr, Done>>> = OnceLock::new();
    ROOTS.get_or_init(Default::default)
}

/// If the root at `addr` runs in this process, waits (at most `timeout`)
/// until every rank of other processes has left it, so that ranks still
/// finishing their last operation keep their health channel when this
/// process exits. Ranks in this process (threads) are not waited for: they
/// keep the process alive themselves. Once the job is aborted, every rank
/// has been told, so nobody is waited for: a stopped rank that never leaves
/// must not hold this process.
pub(crate) fn wait_finished(addr: SocketAddr, timeout: Duration) {
    let Some(done) = local_root(addr) else {
        return;
    };
    let local = || {
        local_clients()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .copied()
            .unwrap_or(0)
    };
    done.wait_while(timeout, |g| {
        !g.aborted && g.remaining != usize::MAX && g.remaining > local()
    });
}

/// Starts the root thread on `listener`; `size` is the job size when the
/// caller (rank 0) knows it already.
pub(crate) fn spawn(
    listener: TcpListener,
    secret: [u8; 16],
    timeout: Duration,
    size: Option<usize>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let done: Done = Arc::default();
    done.lock().size = size;
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
            let mut a = Admitter::new(secret, &done);
            if let Some(ranks) = admit(&listener, &mut a, timeout) {
                super::monitor::serve(ranks, &done, Late { listener, a });
            }
        })?;
    Ok(())
}

/// Prints the first few refusals, then only counts them.
struct WarnLimiter {
    printed: u32,
    unprinted: u64,
    last: String,
    since: Instant,
}

impl WarnLimiter {
    fn new() -> Self {
        WarnLimiter {
            printed: 0,
            unprinted: 0,
            last: String::new(),
            since: Instant::now(),
        }
    }

    fn warn(&mut self, what: &str, why: &str) {
        if self.printed < WARN_BURST {
            self.printed += 1;
            warn!("bootstrap root: {what}: {why}");
        } else {
            self.unprinted += 1;
            self.last = why.to_string();
            self.flush(false);
        }
    }

    fn flush(&mut self, now: bool) {
        if self.unprinted > 0 && (now || self.since.elapsed() >= WARN_SUMMARY_EVERY) {
            warn!(
                "bootstrap root: {} more connections dropped or refused (latest: {})",
                self.unprinted, self.last
            );
            self.unprinted = 0;
            self.since = Instant::now();
        }
    }
}

/// The root's side of admission: sockets in, [`Admission`] decides.
pub(crate) struct Admitter<'a> {
    adm: Admission,
    conns: HashMap<Key, TcpStream>,
    next_key: Key,
    ranks: Option<Vec<TcpStream>>,
    /// Why the admitted job must be aborted: a rank of it claimed again.
    impostor: Option<String>,
    warns: WarnLimiter,
    done: &'a Done,
}

/// The root's listener while the admitted job initialises: a late claim of
/// an admitted rank aborts the job (one of the two claimants came first
/// and took the real rank's place).
pub(crate) struct Late<'a> {
    listener: TcpListener,
    a: Admitter<'a>,
}

impl Late<'_> {
    /// Serves late connections without blocking; the text to abort the job
    /// with if one claimed an admitted rank.
    pub(crate) fn poll(&mut self) -> Option<String> {
        self.a.accept(&self.listener);
        for key in self.a.adm.open_keys() {
            self.a.read(key);
        }
        let actions = self.a.adm.tick(Instant::now());
        self.a.apply(actions);
        self.a.impostor.take()
    }
}

impl<'a> Admitter<'a> {
    fn new(secret: [u8; 16], done: &'a Done) -> Self {
        let size = done.lock().size;
        Admitter {
            adm: Admission::new(secret, size),
            conns: HashMap::new(),
            next_key: 0,
            ranks: None,
            impostor: None,
            warns: WarnLimiter::new(),
            done,
        }
    }

    fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Drop { key, why } => {
                    self.conns.remove(&key);
                    self.warns.warn("dropping a connection", &why);
                }
                Action::Impostor { key, why } => {
                    if let Some(mut s) = self.conns.remove(&key) {
                        let _ = reply(&mut s, format!("ERR {why}").as_bytes());
                    }
                    self.impostor.get_or_insert(why);
                }
                Action::Refuse { key, why } => {
                    if self.adm.failure().is_some() {
                        self.done.lock().refused = true;
                    }
                    if let Some(mut s) = self.conns.remove(&key) {
                        let _ = reply(&mut s, format!("ERR {why}").as_bytes());
                    }
                    self.warns.warn("refusing", &why);
                }
                Action::Admit(keys) => {
                    let mut ranks = Vec::with_capacity(keys.len());
                    for key in keys {
                        let Some(mut s) = self.conns.remove(&key) else {
                            continue;
                        };
                        // A rank that cannot take its OK is found gone by
                        // the monitor, which tells every other rank.
                        let _ = reply(&mut s, b"OK");
                        let _ = s.set_nodelay(true);
                        let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
                        ranks.push(s);
                    }
                    self.ranks = Some(ranks);
                }
            }
        }
    }

    /// Takes the job size a rank of this process announced, if admission
    /// does not know it yet.
    fn sync_size(&mut self) {
        if self.adm.size().is_none() {
            if let Some(n) = self.done.lock().size {
                let actions = self.adm.set_size(n);
                self.apply(actions);
            }
        }
    }

    /// Reads what `key` has sent; true if anything happened.
    fn read(&mut self, key: Key) -> bool {
        let mut tmp = [0u8; 64];
        let Some(s) = self.conns.get_mut(&key) else {
            return false;
        };
        let got = match s.read(&mut tmp) {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                return false
            }
            Err(_) => None,
        };
        let actions = match got {
            Some(n) => {
                // A rank of this process announces the size before it
                // sends its hello: take it first, so the hello is judged by it.
                self.sync_size();
                self.adm.data(key, &tmp[..n])
            }
            None => {
                self.conns.remove(&key);
                self.adm.closed(key)
            }
        };
        self.apply(actions);
        true
    }

    fn accept(&mut self, listener: &TcpListener) -> bool {
        let mut moved = false;
        // Accept a bounded batch, then serve reads, so a flood of idle
        // connections cannot starve the ranks' hellos. A new connection is
        // read at once: a rank's hello is usually already there, so it is
        // held before any eviction can pick it.
        for _ in 0..ACCEPT_BATCH {
            let Ok((stream, peer)) = listener.accept() else {
                break;
            };
            moved = true;
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let key = self.next_key;
            self.next_key += 1;
            self.conns.insert(key, stream);
            let actions = self.adm.connect(key, peer, Instant::now());
            self.apply(actions);
            self.read(key);
        }
        moved
    }
}

/// Answers a connection and leaves it blocking.
fn reply(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_write_timeout(Some(HELLO_DEADLINE))?;
    write_frame(s, msg)
}

/// Accepts connections until every rank has joined; `None` on timeout or
/// when admission failed.
fn admit(
    listener: &TcpListener,
    a: &mut Admitter<'_>,
    timeout: Duration,
) -> Option<Vec<TcpStream>> {
    let deadline = Instant::now() + timeout;
    loop {
        a.sync_size();
        if let Some(ranks) = a.ranks.take() {
            a.warns.flush(true);
            info!(nranks = ranks.len(), "bootstrap root: every rank joined");
            return Some(ranks);
        }
        if a.adm.failure_told() {
            a.warns.flush(true);
            warn!(
                "bootstrap root: the job was refused: {}",
                a.adm.failure().unwrap_or_default()
            );
            return None;
        }
        if Instant::now() > deadline {
            a.warns.flush(true);
            match a.adm.failure() {
                Some(why) => warn!("bootstrap root: the job was refused: {why}"),
                None => {
                    let held = a.adm.held_ranks();
                    let size = a.adm.size().map_or("?".into(), |n| n.to_string());
                    warn!(
                        "bootstrap root: not every rank joined within {timeout:?}: ranks {held:?} of {size} did; giving up"
                    );
                }
            }
            return None;
        }
        let mut moved = a.accept(listener);
        for key in a.adm.open_keys() {
            moved |= a.read(key);
        }
        let actions = a.adm.tick(Instant::now());
        moved |= !actions.is_empty();
        a.apply(actions);
        a.warns.flush(false);
        if !moved {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
