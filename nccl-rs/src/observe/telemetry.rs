//! Per-communicator, per-peer telemetry: bytes and messages each way, time
//! spent waiting on each peer, errors per peer, and a latency histogram per
//! collective kind.
//!
//! # What is counted
//! - **Bytes and messages** are the user payload the schedule moves to or
//!   from a peer, counted by the engine when a send is handed to the
//!   transport and when a receive's data has arrived, for shared-memory and
//!   network peers alike: a transport's own framing, headers and
//!   acknowledgements are not counted, so the numbers are exactly those
//!   the schedule prescribes (e.g. a ring all-reduce of `c` elements of `e`
//!   bytes on `n` ranks sends `2(n-1)` messages, `2(n-1)·c/n·e` bytes in
//!   all, to the next rank of the ring when `c·e/n` fits one chunk).
//! - **Control traffic**, the library's own small exchanges around a call
//!   (the zero-copy path's buffer descriptors and barriers, the placement
//!   probe's round trips), is counted apart, so the payload counters stay
//!   predictable.
//! - **Direct bytes** are the payload the zero-copy path (ranks of one
//!   host on shared buffers) reads from a peer's buffers and writes into
//!   them, straight, with no message: counted from the plan each rank ran.
//! - **Waits** are the time an operation sat idle (its polls moving
//!   nothing) while waiting for data from a peer (`recv`), or for a peer to
//!   take a send: no transport credit yet, or a send not yet complete
//!   (`send`). The clock is read only once a poll found nothing to do, so
//!   very short waits (a few dozen polls) are not counted.
//! - **Errors** are transport errors per peer, by kind: `io` (socket or
//!   verbs failures, connection closed), `protocol` (tag mismatch,
//!   truncation, malformed data), `timeout` (an operation that passed
//!   `NCCL_RS_TIMEOUT` waiting on this peer), `other`. The transports retry
//!   connects and verbs retries packets in hardware without reporting
//!   them; an exhausted verbs retry arrives as an `io` error.
//! - **Retransmits** are what the kernel or adapter counts for the
//!   connections with a peer (TCP: `tcpi_total_retrans` summed over the
//!   sockets of both directions' connections), read from the transport's
//!   link probes ([`nccl_net::LinkProbe`]) when a snapshot is taken, never
//!   on the data path. Shared-memory peers have none.
//! - **Latency** per collective kind (and `send_recv` for grouped
//!   point-to-point): every successful call on this rank is counted, and
//!   one in [`LATENCY_SAMPLE`] is timed, from entering the communicator's
//!   core to completion, into log2 buckets.
//!
//! # Cost
//! Every counter has one writer, the thread that holds the communicator's
//! engine (operations of one communicator run one at a time), so a count is
//! a relaxed load and store, no locked instruction; readers (`stats()`, the
//! Prometheus writer, RAS) load relaxed and may see a count an operation
//! later. A timed call reads the clock twice.

use crate::schedule::{ZcAt, ZcBuf, ZcStep};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Collective kinds with a latency histogram: the eight collectives in
/// `plan::Coll::index` order, then grouped send/recv.
pub const COLL_NAMES: [&str; COLL_KINDS] = [
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "all_to_all",
    "gather",
    "scatter",
    "send_recv",
];
/// How many kinds [`COLL_NAMES`] has.
pub const COLL_KINDS: usize = 9;
/// The kind index of grouped send/recv.
pub(crate) const SEND_RECV: usize = 8;

/// Smallest histogram bound: 2^10 ns (about 1 µs).
pub const HIST_MIN_LOG2: u32 = 10;
/// Largest finite histogram bound: 2^36 ns (about 69 s).
pub const HIST_MAX_LOG2: u32 = 36;
/// Finite buckets, plus one for everything above the largest bound.
pub const HIST_BUCKETS: usize = (HIST_MAX_LOG2 - HIST_MIN_LOG2 + 1) as usize + 1;

/// Adds `n` to a counter that only the calling thread writes.
#[inline(always)]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

/// The histogram bucket of a duration of `ns` nanoseconds: bucket `i`
/// holds durations `d` with `d <= 2^(HIST_MIN_LOG2 + i)` ns and above the
/// bound before it; the last bucket holds everything above `2^HIST_MAX_LOG2`.
pub fn bucket_of(ns: u64) -> usize {
    // The smallest k with ns <= 2^k.
    let k = 64 - ns.saturating_sub(1).leading_zeros();
    (k.max(HIST_MIN_LOG2) - HIST_MIN_LOG2).min(HIST_BUCKETS as u32 - 1) as usize
}

/// Upper bound of bucket `i` in nanoseconds (`None`: the unbounded last one).
pub fn bucket_upper_ns(i: usize) -> Option<u64> {
    (i + 1 < HIST_BUCKETS).then(|| 1u64 << (HIST_MIN_LOG2 + i as u32))
}

/// Counters of one peer (one traffic class).
#[derive(Default)]
struct PeerCells {
    bytes_sent: AtomicU64,
    bytes_recv: AtomicU64,
    msgs_sent: AtomicU64,
    msgs_recv: AtomicU64,
    recv_wait_ns: AtomicU64,
    send_wait_ns: AtomicU64,
    direct_read: AtomicU64,
    direct_written: AtomicU64,
    errors: [AtomicU64; ERROR_KINDS],
}

/// One call in this many of each collective kind is timed, the first
/// included: two clock reads cost up to ~50 ns (a VM's `rdtsc`), a sixth
/// of an 8-byte call, and a regular sample shows the same spread.
pub const LATENCY_SAMPLE: u64 = 16;

/// Call and latency counters of one collective kind.
struct HistCells {
    calls: AtomicU64,
    buckets: [AtomicU64; HIST_BUCKETS],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Default for HistCells {
    fn default() -> HistCells {
        HistCells {
            calls: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

/// Kinds of peer errors, in [`ErrorCounts`] order.
const ERROR_KINDS: usize = 4;

/// A transport error's kind, for the per-peer error counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    Io = 0,
    Protocol = 1,
    Timeout = 2,
    Other = 3,
}

impl ErrorKind {
    /// The kind of a transport error.
    pub(crate) fn of(e: &nccl_net::NetError) -> ErrorKind {
        use nccl_net::NetError as E;
        match e {
            E::Io { .. } | E::Closed(_) => ErrorKind::Io,
            E::TagMismatch { .. } | E::Truncated { .. } | E::Protocol(_) | E::BadHandle(_) => {
                ErrorKind::Protocol
            }
            _ => ErrorKind::Other,
        }
    }
}

/// What an idle operation waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Data from the peer.
    Recv(usize),
    /// The peer to take (or complete) a send.
    Send(usize),
}

/// The live counters of one communicator (shared by its engine, its
/// `Communicator`, the Prometheus writer and RAS).
pub struct Telemetry {
    comm: u64,
    rank: usize,
    nranks: usize,
    payload: Box<[PeerCells]>,
    control: Box<[PeerCells]>,
    colls: Box<[HistCells]>,
    /// What [`Telemetry::stats`] subtracts (set by [`Telemetry::reset`]).
    baseline: Mutex<Option<CommStats>>,
    /// Link probes of each peer's connections (set once, after connecting).
    links: OnceLock<Box<[Vec<nccl_net::SharedProbe>]>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("comm", &format_args!("{:#x}", self.comm))
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .finish()
    }
}

impl Telemetry {
    /// Counters for rank `rank` of `nranks` of communicator `comm` (an id
    /// shared by the communicator's ranks, see [`comm_id`]).
    pub(crate) fn new(comm: u64, rank: usize, nranks: usize) -> Telemetry {
        super::clock::init();
        let cells = || (0..nranks).map(|_| PeerCells::default()).collect();
        Telemetry {
            comm,
            rank,
            nranks,
            payload: cells(),
            control: cells(),
            colls: (0..COLL_KINDS).map(|_| HistCells::default()).collect(),
            baseline: Mutex::new(None),
            links: OnceLock::new(),
        }
    }

    /// Sets the link probes of each peer's connections (`probes[peer]`);
    /// only the first call counts.
    pub(crate) fn set_links(&self, probes: Vec<Vec<nccl_net::SharedProbe>>) {
        let _ = self.links.set(probes.into_boxed_slice());
    }

    /// The link counters of `peer`'s connections now (zero without probes).
    fn link(&self, peer: usize) -> nccl_net::LinkCounters {
        self.links
            .get()
            .and_then(|l| l.get(peer))
            .map_or_else(Default::default, |v| {
                v.iter()
                    .fold(Default::default(), |acc: nccl_net::LinkCounters, p| {
                        acc.plus(p.sample())
                    })
            })
    }

    /// The communicator's id (the `comm` label).
    pub fn comm(&self) -> u64 {
        self.comm
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    fn class(&self, control: bool) -> &[PeerCells] {
        if control {
            &self.control
        } else {
            &self.payload
        }
    }

    /// A message of `bytes` handed to the transport for `peer`.
    #[inline]
    pub(crate) fn sent(&self, control: bool, peer: usize, bytes: usize) {
        if let Some(c) = self.class(control).get(peer) {
            bump(&c.bytes_sent, bytes as u64);
            bump(&c.msgs_sent, 1);
        }
    }

    /// A message of `bytes` received from `peer`.
    #[inline]
    pub(crate) fn received(&self, control: bool, peer: usize, bytes: usize) {
        if let Some(c) = self.class(control).get(peer) {
            bump(&c.bytes_recv, bytes as u64);
            bump(&c.msgs_recv, 1);
        }
    }

    /// Time an operation sat idle on `wait`.
    pub(crate) fn waited(&self, wait: Option<Wait>, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        match wait {
            Some(Wait::Recv(p)) => {
                if let Some(c) = self.payload.get(p) {
                    bump(&c.recv_wait_ns, ns);
                }
            }
            Some(Wait::Send(p)) => {
                if let Some(c) = self.payload.get(p) {
                    bump(&c.send_wait_ns, ns);
                }
            }
            None => {}
        }
    }

    /// The bytes a zero-copy plan that rank `self.rank` ran, `steps` on
    /// elements of `elem` bytes, read from and wrote into each peer's
    /// buffers.
    pub(crate) fn zero_copy(&self, steps: &[ZcStep], elem: usize) {
        let me = self.rank;
        let touch = |at: &ZcAt, count: usize, read: bool, written: bool| {
            let q = match at.buf {
                ZcBuf::In(q) | ZcBuf::Out(q) => q,
            };
            let Some(c) = self.payload.get(q).filter(|_| q != me) else {
                return;
            };
            let bytes = (count * elem) as u64;
            if read {
                bump(&c.direct_read, bytes);
            }
            if written {
                bump(&c.direct_written, bytes);
            }
        };
        for step in steps {
            match step {
                ZcStep::Copy { src, dst, count } => {
                    touch(src, *count, true, false);
                    touch(dst, *count, false, true);
                }
                ZcStep::Reduce { srcs, dsts, count } => {
                    srcs.iter().for_each(|a| touch(a, *count, true, false));
                    dsts.iter().for_each(|a| touch(a, *count, false, true));
                }
                // Each side is read and then written with the other's data.
                ZcStep::Swap { a, b, count } => {
                    touch(a, *count, true, true);
                    touch(b, *count, true, true);
                }
            }
        }
    }

    /// An error of `kind` on the connection with `peer`.
    pub(crate) fn error(&self, peer: usize, kind: ErrorKind) {
        if let Some(c) = self.payload.get(peer) {
            bump(&c.errors[kind as usize], 1);
        }
    }

    /// Whether the next call of collective kind `kind` is to be timed (one
    /// in [`LATENCY_SAMPLE`], the first included).
    #[inline]
    pub(crate) fn times_next(&self, kind: usize) -> bool {
        self.colls
            .get(kind)
            .is_some_and(|h| h.calls.load(Relaxed) % LATENCY_SAMPLE == 0)
    }

    /// A successful call of collective kind `kind`, which took `d` if it
    /// was timed.
    #[inline]
    pub(crate) fn observe(&self, kind: usize, d: Option<Duration>) {
        let Some(h) = self.colls.get(kind) else {
            return;
        };
        bump(&h.calls, 1);
        if let Some(d) = d {
            let ns = d.as_nanos().min(u64::MAX as u128) as u64;
            bump(&h.buckets[bucket_of(ns)], 1);
            bump(&h.sum_ns, ns);
            bump(&h.count, 1);
        }
    }

    /// Every counter since the communicator was created (what the
    /// Prometheus file shows: counters never go down).
    pub fn totals(&self) -> CommStats {
        let load = |a: &AtomicU64| a.load(Relaxed);
        let peers = (0..self.nranks)
            .map(|p| {
                let (c, k) = (&self.payload[p], &self.control[p]);
                PeerStats {
                    peer: p,
                    bytes_sent: load(&c.bytes_sent),
                    bytes_recv: load(&c.bytes_recv),
                    msgs_sent: load(&c.msgs_sent),
                    msgs_recv: load(&c.msgs_recv),
                    control_bytes_sent: load(&k.bytes_sent),
                    control_bytes_recv: load(&k.bytes_recv),
                    control_msgs_sent: load(&k.msgs_sent),
                    control_msgs_recv: load(&k.msgs_recv),
                    recv_wait: Duration::from_nanos(load(&c.recv_wait_ns)),
                    send_wait: Duration::from_nanos(load(&c.send_wait_ns)),
                    direct_bytes_read: load(&c.direct_read),
                    direct_bytes_written: load(&c.direct_written),
                    errors: ErrorCounts {
                        io: load(&c.errors[ErrorKind::Io as usize]),
                        protocol: load(&c.errors[ErrorKind::Protocol as usize]),
                        timeout: load(&c.errors[ErrorKind::Timeout as usize]),
                        other: load(&c.errors[ErrorKind::Other as usize]),
                    },
                    retransmits: self.link(p).retransmits,
                }
            })
            .collect();
        let colls = self
            .colls
            .iter()
            .enumerate()
            .map(|(i, h)| LatencyHistogram {
                coll: COLL_NAMES[i],
                calls: load(&h.calls),
                buckets: std::array::from_fn(|b| load(&h.buckets[b])),
                sum: Duration::from_nanos(load(&h.sum_ns)),
                count: load(&h.count),
            })
            .collect();
        CommStats {
            comm: self.comm,
            rank: self.rank,
            nranks: self.nranks,
            peers,
            colls,
        }
    }

    /// The counters since the last [`Telemetry::reset`] (since creation
    /// before any).
    pub fn stats(&self) -> CommStats {
        let now = self.totals();
        match &*self.baseline.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(base) => now.minus(base),
            None => now,
        }
    }

    /// Makes [`Telemetry::stats`] count from now on. The counters
    /// themselves (and the Prometheus file) keep counting up.
    pub fn reset(&self) {
        let now = self.totals();
        *self.baseline.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
    }
}

/// A communicator's id for the `comm` label, the same on all its ranks: a
/// hash of the bytes of its unique id (as NCCL's `commHash`).
pub fn comm_id(unique_id: &[u8]) -> u64 {
    // FNV-1a, 64 bits: stable across processes and releases.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in unique_id {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Errors on the connection with one peer, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    /// Socket or verbs failures, connections closed.
    pub io: u64,
    /// Tag mismatches, truncated or malformed messages.
    pub protocol: u64,
    /// Operations that timed out waiting on this peer.
    pub timeout: u64,
    /// Anything else.
    pub other: u64,
}

/// Counters of one peer of a communicator (see the module docs of
/// [`crate::observe::telemetry`] for what each counts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// The peer's rank.
    pub peer: usize,
    /// Payload bytes sent to the peer.
    pub bytes_sent: u64,
    /// Payload bytes received from the peer.
    pub bytes_recv: u64,
    /// Payload messages sent to the peer.
    pub msgs_sent: u64,
    /// Payload messages received from the peer.
    pub msgs_recv: u64,
    /// Control bytes (the library's own exchanges) sent to the peer.
    pub control_bytes_sent: u64,
    /// Control bytes received from the peer.
    pub control_bytes_recv: u64,
    /// Control messages sent to the peer.
    pub control_msgs_sent: u64,
    /// Control messages received from the peer.
    pub control_msgs_recv: u64,
    /// Time spent idle waiting for the peer's data.
    pub recv_wait: Duration,
    /// Time spent idle waiting for the peer to take a send.
    pub send_wait: Duration,
    /// Payload bytes the zero-copy path read straight from the peer's
    /// buffers.
    pub direct_bytes_read: u64,
    /// Payload bytes the zero-copy path wrote straight into the peer's
    /// buffers.
    pub direct_bytes_written: u64,
    /// Errors on the connection with the peer.
    pub errors: ErrorCounts,
    /// Segments or packets retransmitted on the connections with the peer,
    /// as the kernel or adapter counts them (0 for shared memory).
    pub retransmits: u64,
}

impl PeerStats {
    /// Whether anything was counted for this peer.
    pub fn is_zero(&self) -> bool {
        *self
            == PeerStats {
                peer: self.peer,
                ..PeerStats::default()
            }
    }
}

/// Calls of one collective kind, and the latencies of the timed ones (one
/// in [`LATENCY_SAMPLE`]): counts per log2 bucket (bucket `i` holds calls
/// that took at most `2^(HIST_MIN_LOG2 + i)` ns and more than the bound
/// before it; see [`bucket_upper_ns`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// The kind, one of [`COLL_NAMES`].
    pub coll: &'static str,
    /// Successful calls.
    pub calls: u64,
    /// Timed calls per bucket (not cumulative).
    pub buckets: [u64; HIST_BUCKETS],
    /// Total time of the timed calls.
    pub sum: Duration,
    /// Number of timed calls.
    pub count: u64,
}

impl LatencyHistogram {
    /// `(upper bound in ns, calls at most that long)` per bucket,
    /// cumulative as Prometheus has them; the last bound is `None` (+Inf).
    pub fn cumulative(&self) -> Vec<(Option<u64>, u64)> {
        let mut acc = 0u64;
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                acc = acc.wrapping_add(c);
                (bucket_upper_ns(i), acc)
            })
            .collect()
    }
}

/// A snapshot of one communicator's telemetry on this rank
/// ([`crate::Communicator::stats`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommStats {
    /// The communicator's id, the same on every rank ([`comm_id`]).
    pub comm: u64,
    /// This rank.
    pub rank: usize,
    /// Ranks of the communicator.
    pub nranks: usize,
    /// One entry per rank of the communicator, this rank's own included
    /// (all zero), indexed by rank.
    pub peers: Vec<PeerStats>,
    /// One entry per kind of [`COLL_NAMES`], in that order.
    pub colls: Vec<LatencyHistogram>,
}

impl CommStats {
    /// The latency histogram of collective kind `coll` (a [`COLL_NAMES`] name).
    pub fn coll(&self, coll: &str) -> Option<&LatencyHistogram> {
        self.colls.iter().find(|h| h.coll == coll)
    }

    /// `self - base`, counter by counter (wrapping).
    fn minus(mut self, base: &CommStats) -> CommStats {
        let d = |a: &mut u64, b: u64| *a = a.wrapping_sub(b);
        for (p, b) in self.peers.iter_mut().zip(&base.peers) {
            d(&mut p.bytes_sent, b.bytes_sent);
            d(&mut p.bytes_recv, b.bytes_recv);
            d(&mut p.msgs_sent, b.msgs_sent);
            d(&mut p.msgs_recv, b.msgs_recv);
            d(&mut p.control_bytes_sent, b.control_bytes_sent);
            d(&mut p.control_bytes_recv, b.control_bytes_recv);
            d(&mut p.control_msgs_sent, b.control_msgs_sent);
            d(&mut p.control_msgs_recv, b.control_msgs_recv);
            p.recv_wait = p.recv_wait.saturating_sub(b.recv_wait);
            p.send_wait = p.send_wait.saturating_sub(b.send_wait);
            d(&mut p.direct_bytes_read, b.direct_bytes_read);
            d(&mut p.direct_bytes_written, b.direct_bytes_written);
            d(&mut p.errors.io, b.errors.io);
            d(&mut p.errors.protocol, b.errors.protocol);
            d(&mut p.errors.timeout, b.errors.timeout);
            d(&mut p.errors.other, b.errors.other);
            d(&mut p.retransmits, b.retransmits);
        }
        for (h, b) in self.colls.iter_mut().zip(&base.colls) {
            d(&mut h.calls, b.calls);
            for (x, y) in h.buckets.iter_mut().zip(&b.buckets) {
                d(x, *y);
            }
            h.sum = h.sum.saturating_sub(b.sum);
            d(&mut h.count, b.count);
        }
        self
    }
}

/// The live communicators of this process, for the Prometheus writer and
/// RAS.
fn registry() -> &'static Mutex<Vec<Arc<Telemetry>>> {
    static LIVE: OnceLock<Mutex<Vec<Arc<Telemetry>>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new()))
}

/// Adds a communicator's telemetry to the process's live set.
pub(crate) fn register(t: &Arc<Telemetry>) {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(t.clone());
}

/// Removes a communicator's telemetry from the live set.
pub(crate) fn unregister(t: &Arc<Telemetry>) {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|x| !Arc::ptr_eq(x, t));
}

/// The live communicators' telemetry in this process (cheap: a lock, and
/// a reference count per communicator; no counter is read).
pub fn live() -> Vec<Arc<Telemetry>> {
    registry().lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The totals of every live communicator of this process, oldest first
/// (for RAS and the Prometheus writer).
pub fn snapshot_all() -> Vec<CommStats> {
    live().iter().map(|t| t.totals()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_with_inclusive_upper_bounds() {
        // (duration ns, bucket)
        let table: &[(u64, usize)] = &[
            (0, 0),
            (1, 0),
            (1024, 0),
            (1025, 1),
            (2048, 1),
            (2049, 2),
            (1 << 20, 10),
            ((1 << 20) + 1, 11),
            (1 << 36, HIST_BUCKETS - 2),
            ((1 << 36) + 1, HIST_BUCKETS - 1),
            (u64::MAX, HIST_BUCKETS - 1),
        ];
        for &(ns, b) in table {
            assert_eq!(bucket_of(ns), b, "{ns} ns");
            if let Some(up) = bucket_upper_ns(b) {
                assert!(ns <= up, "{ns} ns above its bucket's bound {up}");
            }
            if b > 0 {
                let below = bucket_upper_ns(b - 1).expect("finite");
                assert!(ns > below, "{ns} ns not above the previous bound {below}");
            }
        }
        assert_eq!(bucket_upper_ns(0), Some(1024));
        assert_eq!(bucket_upper_ns(HIST_BUCKETS - 2), Some(1 << 36));
        assert_eq!(bucket_upper_ns(HIST_BUCKETS - 1), None);
    }

    #[test]
    fn observe_fills_one_bucket_sum_and_count() {
        let t = Telemetry::new(7, 0, 2);
        t.observe(0, Some(Duration::from_nanos(1500)));
        t.observe(0, Some(Duration::from_nanos(1500)));
        t.observe(0, None);
        t.observe(0, Some(Duration::from_secs(100)));
        t.observe(SEND_RECV, Some(Duration::from_nanos(10)));
        let s = t.stats();
        let h = s.coll("all_reduce").expect("kind");
        assert_eq!((h.calls, h.count), (4, 3));
        assert_eq!(h.sum, Duration::from_nanos(3000) + Duration::from_secs(100));
        let mut want = [0u64; HIST_BUCKETS];
        want[1] = 2;
        want[HIST_BUCKETS - 1] = 1;
        assert_eq!(h.buckets, want);
        let cum = h.cumulative();
        assert_eq!(cum[0], (Some(1024), 0));
        assert_eq!(cum[1], (Some(2048), 2));
        assert_eq!(cum[HIST_BUCKETS - 2], (Some(1 << 36), 2));
        assert_eq!(cum[HIST_BUCKETS - 1], (None, 3));
        assert_eq!(s.coll("send_recv").expect("kind").buckets[0], 1);
        assert_eq!(s.coll("broadcast").expect("kind").count, 0);
    }

    #[test]
    fn one_call_in_the_sample_is_timed_the_first_included() {
        let t = Telemetry::new(7, 0, 2);
        let timed: Vec<u64> = (0..2 * LATENCY_SAMPLE + 1)
            .filter(|&i| {
                let yes = t.times_next(0);
                t.observe(0, yes.then_some(Duration::from_nanos(10)));
                assert_eq!(t.stats().colls[0].calls, i + 1);
                yes
            })
            .collect();
        assert_eq!(timed, [0, LATENCY_SAMPLE, 2 * LATENCY_SAMPLE]);
        // Kinds sample apart.
        assert!(t.times_next(SEND_RECV));
        assert!(!t.times_next(0));
    }

    #[test]
    fn counters_per_peer_and_class_and_reset() {
        let t = Telemetry::new(7, 1, 3);
        t.sent(false, 0, 100);
        t.sent(false, 0, 28);
        t.received(false, 2, 64);
        t.sent(true, 2, 8);
        t.received(true, 0, 8);
        t.waited(Some(Wait::Recv(2)), Duration::from_micros(5));
        t.waited(Some(Wait::Send(0)), Duration::from_micros(7));
        t.waited(None, Duration::from_micros(9));
        t.error(2, ErrorKind::Io);
        t.error(2, ErrorKind::Timeout);
        // Out of range: ignored, never a panic.
        t.sent(false, 9, 1);
        t.error(9, ErrorKind::Other);
        let s = t.stats();
        assert_eq!(s.peers.len(), 3);
        let p0 = &s.peers[0];
        assert_eq!((p0.bytes_sent, p0.msgs_sent, p0.bytes_recv), (128, 2, 0));
        assert_eq!((p0.control_msgs_recv, p0.control_bytes_recv), (1, 8));
        assert_eq!(p0.send_wait, Duration::from_micros(7));
        let p2 = &s.peers[2];
        assert_eq!((p2.bytes_recv, p2.msgs_recv), (64, 1));
        assert_eq!((p2.control_bytes_sent, p2.control_msgs_sent), (8, 1));
        assert_eq!(p2.recv_wait, Duration::from_micros(5));
        assert_eq!(
            p2.errors,
            ErrorCounts {
                io: 1,
                timeout: 1,
                ..ErrorCounts::default()
            }
        );
        assert!(s.peers[1].is_zero());
        t.reset();
        assert!(t.stats().peers.iter().all(PeerStats::is_zero));
        t.sent(false, 0, 5);
        assert_eq!(t.stats().peers[0].bytes_sent, 5);
        // The totals keep counting from creation.
        assert_eq!(t.totals().peers[0].bytes_sent, 133);
    }

    #[test]
    fn zero_copy_plans_count_direct_bytes_per_peer() {
        use crate::schedule::{zero_copy, ZcColl};
        // All-reduce of 12 elements of 4 bytes on 3 ranks: rank 1 reduces
        // elements 4..8 of every input and writes them to every output.
        let t = Telemetry::new(7, 1, 3);
        t.zero_copy(&zero_copy(ZcColl::AllReduce { count: 12 }, 3, 1), 4);
        let s = t.stats();
        let direct = |p: usize| {
            (
                s.peers[p].direct_bytes_read,
                s.peers[p].direct_bytes_written,
            )
        };
        assert_eq!(
            [direct(0), direct(1), direct(2)],
            [(16, 16), (0, 0), (16, 16)]
        );
        assert_eq!(s.peers[0].bytes_sent, 0);
        // A hand-made plan: a copy from rank 0, a swap with rank 2.
        let t = Telemetry::new(7, 1, 3);
        let at = |buf, off| ZcAt { buf, off };
        t.zero_copy(
            &[
                ZcStep::Copy {
                    src: at(ZcBuf::In(0), 0),
                    dst: at(ZcBuf::Out(1), 0),
                    count: 3,
                },
                ZcStep::Swap {
                    a: at(ZcBuf::Out(1), 3),
                    b: at(ZcBuf::Out(2), 0),
                    count: 5,
                },
            ],
            2,
        );
        let s = t.stats();
        let direct = |p: usize| {
            (
                s.peers[p].direct_bytes_read,
                s.peers[p].direct_bytes_written,
            )
        };
        assert_eq!(
            [direct(0), direct(1), direct(2)],
            [(6, 0), (0, 0), (10, 10)]
        );
    }

    #[test]
    fn error_kinds_of_transport_errors() {
        use nccl_net::NetError as E;
        let io = E::Io {
            call: "send",
            source: std::io::Error::from_raw_os_error(libc::ECONNRESET),
        };
        assert_eq!(ErrorKind::of(&io), ErrorKind::Io);
        assert_eq!(ErrorKind::of(&E::Closed("x".into())), ErrorKind::Io);
        let tm = E::TagMismatch {
            expected: 1,
            got: 2,
        };
        assert_eq!(ErrorKind::of(&tm), ErrorKind::Protocol);
        assert_eq!(ErrorKind::of(&E::Unsupported("x".into())), ErrorKind::Other);
    }

    #[derive(Debug)]
    struct Fixed(std::sync::atomic::AtomicU64);
    impl nccl_net::LinkProbe for Fixed {
        fn sample(&self) -> nccl_net::LinkCounters {
            nccl_net::LinkCounters {
                retransmits: self.0.load(Relaxed),
            }
        }
    }

    #[test]
    fn retransmits_sum_each_peers_probes_and_reset() {
        let t = Telemetry::new(7, 0, 3);
        assert_eq!(t.totals().peers[1].retransmits, 0);
        let a = Arc::new(Fixed(AtomicU64::new(3)));
        let b = Arc::new(Fixed(AtomicU64::new(4)));
        let c = Arc::new(Fixed(AtomicU64::new(100)));
        let probes: Vec<Vec<nccl_net::SharedProbe>> = vec![vec![], vec![a.clone(), b], vec![c]];
        t.set_links(probes);
        // Only the first call counts.
        t.set_links(vec![vec![], vec![], vec![]]);
        let s = t.stats();
        let r: Vec<u64> = s.peers.iter().map(|p| p.retransmits).collect();
        assert_eq!(r, [0, 7, 100]);
        assert!(!s.peers[1].is_zero());
        t.reset();
        a.0.store(5, Relaxed);
        assert_eq!(t.stats().peers[1].retransmits, 2);
        assert_eq!(t.totals().peers[1].retransmits, 9);
    }

    #[test]
    fn comm_id_is_fnv1a() {
        // FNV-1a test vectors.
        assert_eq!(comm_id(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(comm_id(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
