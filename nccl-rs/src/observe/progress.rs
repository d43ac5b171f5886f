//! Per communicator and rank: how far its operations got and, when blocked,
//! what it waits on. The engine writes it with relaxed atomic stores (a
//! handful per operation, and one wait record per idle millisecond); the RAS
//! thread reads it at each heartbeat. Readers may see fields of two
//! neighbouring moments: the record is a diagnosis, not a synchronisation.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

/// Operation names by code ([`Progress::op`]); 0 is "none yet".
pub const OP_NAMES: &[&str] = &[
    "",
    "AllReduce",
    "ReduceScatter",
    "AllGather",
    "Broadcast",
    "Reduce",
    "AllToAll",
    "Gather",
    "Scatter",
    "SendRecv",
];
/// Code of a send/recv group in [`OP_NAMES`].
pub const OP_SENDRECV: u32 = 9;

/// The code in [`OP_NAMES`] of a collective.
#[inline]
pub(crate) fn coll_code(c: &crate::plan::Coll) -> u32 {
    use crate::plan::Coll;
    match c {
        Coll::AllReduce { .. } => 1,
        Coll::ReduceScatter { .. } => 2,
        Coll::AllGather { .. } => 3,
        Coll::Broadcast { .. } => 4,
        Coll::Reduce { .. } => 5,
        Coll::AllToAll { .. } => 6,
        Coll::Gather { .. } => 7,
        Coll::Scatter { .. } => 8,
    }
}

/// What a blocked rank waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// Data from the peer (the current step receives from it).
    Recv = 1,
    /// The peer to take data (a send that the transport has no room for,
    /// or sends still in flight at the end of the operation).
    Send = 2,
}

impl WaitKind {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            WaitKind::Recv => "recv",
            WaitKind::Send => "send",
        }
    }

    pub(crate) fn from_code(c: u64) -> Option<WaitKind> {
        match c {
            1 => Some(WaitKind::Recv),
            2 => Some(WaitKind::Send),
            _ => None,
        }
    }
}

/// Where an operation stands when it makes no progress: its current step
/// of `steps`, and the peer it waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPoint {
    /// The step the engine executes next (0-based).
    pub step: usize,
    /// Steps of the operation's schedule.
    pub steps: usize,
    /// The peer and what for; `None` when nothing is outstanding.
    pub on: Option<(usize, WaitKind)>,
}

/// A snapshot of one [`Progress`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgressSnapshot {
    /// Identity of the communicator, the same on all its ranks.
    pub comm_id: u64,
    /// This rank in it.
    pub rank: u32,
    /// Its ranks.
    pub nranks: u32,
    /// Sequence number of the last collective started (0: none yet).
    pub coll_started: u64,
    /// Sequence number of the last collective completed.
    pub coll_done: u64,
    /// Name of the last operation started ("" if none).
    pub op: String,
    /// Send/recv groups started.
    pub p2p_started: u64,
    /// Send/recv groups completed.
    pub p2p_done: u64,
    /// What the operation in flight waits on, and for how long (ms).
    pub wait: Option<WaitRecord>,
    /// The communicator's first error.
    pub error: Option<String>,
}

/// A recorded wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitRecord {
    /// The peer rank.
    pub peer: u32,
    /// What for.
    pub kind: WaitKind,
    /// Current step (0-based) and steps of the schedule.
    pub step: u32,
    /// Steps of the schedule.
    pub steps: u32,
    /// Milliseconds since this wait began.
    pub ms: u64,
}

/// The progress record of one rank of one communicator.
#[derive(Debug)]
pub struct Progress {
    comm_id: u64,
    rank: u32,
    nranks: u32,
    coll_started: AtomicU64,
    coll_done: AtomicU64,
    op: AtomicU32,
    p2p_started: AtomicU64,
    p2p_done: AtomicU64,
    /// `kind << 32 | peer`; 0: not waiting.
    wait_on: AtomicU64,
    /// `step << 32 | steps`.
    wait_step: AtomicU64,
    /// Milliseconds since [`epoch`] when the recorded wait began.
    wait_since: AtomicU64,
    failed: AtomicBool,
    error: Mutex<Option<String>>,
}

/// The process's clock origin for wait times.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

fn registry() -> &'static Mutex<Vec<Weak<Progress>>> {
    static REG: OnceLock<Mutex<Vec<Weak<Progress>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(Vec::new()))
}

impl Progress {
    /// A record not listed anywhere.
    pub fn new(comm_id: u64, rank: usize, nranks: usize) -> Progress {
        epoch();
        Progress {
            comm_id,
            rank: rank as u32,
            nranks: nranks as u32,
            coll_started: AtomicU64::new(0),
            coll_done: AtomicU64::new(0),
            op: AtomicU32::new(0),
            p2p_started: AtomicU64::new(0),
            p2p_done: AtomicU64::new(0),
            wait_on: AtomicU64::new(0),
            wait_step: AtomicU64::new(0),
            wait_since: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        }
    }

    /// A record listed in this process's registry ([`snapshot_all`]) for
    /// as long as it lives.
    pub fn registered(comm_id: u64, rank: usize, nranks: usize) -> Arc<Progress> {
        let p = Arc::new(Progress::new(comm_id, rank, nranks));
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&p));
        p
    }

    /// Collective `seq` (code `op` of [`OP_NAMES`]) started.
    #[inline]
    pub fn coll_started(&self, seq: u64, op: u32) {
        self.op.store(op, Relaxed);
        self.coll_started.store(seq, Relaxed);
    }

    /// Collective `seq` completed.
    #[inline]
    pub fn coll_done(&self, seq: u64) {
        self.wait_on.store(0, Relaxed);
        self.coll_done.store(seq, Relaxed);
    }

    /// A send/recv group started.
    #[inline]
    pub fn p2p_started(&self) {
        self.op.store(OP_SENDRECV, Relaxed);
        self.p2p_started.fetch_add(1, Relaxed);
    }

    /// A send/recv group completed.
    #[inline]
    pub fn p2p_done(&self) {
        self.wait_on.store(0, Relaxed);
        self.p2p_done.fetch_add(1, Relaxed);
    }

    /// Records where the operation in flight stands while idle (the engine
    /// calls this about once per idle millisecond). A wait on the same
    /// peer and step keeps its start time.
    pub fn set_wait(&self, w: WaitPoint) {
        let on = match w.on {
            Some((peer, kind)) => ((kind as u64) << 32) | (peer as u64 & 0xffff_ffff),
            None => 0,
        };
        let step = ((w.step as u64) << 32) | (w.steps as u64 & 0xffff_ffff);
        if self.wait_on.load(Relaxed) != on || self.wait_step.load(Relaxed) != step {
            self.wait_since.store(now_ms(), Relaxed);
            self.wait_step.store(step, Relaxed);
            self.wait_on.store(on, Relaxed);
        }
    }

    /// Records the communicator's first error (the operation failed).
    pub fn set_error(&self, e: &str) {
        if !self.failed.swap(true, Relaxed) {
            *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        }
        self.wait_on.store(0, Relaxed);
    }

    /// The record as it is now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        let on = self.wait_on.load(Relaxed);
        let step = self.wait_step.load(Relaxed);
        let since = self.wait_since.load(Relaxed);
        let wait = WaitKind::from_code(on >> 32).map(|kind| WaitRecord {
            peer: on as u32,
            kind,
            step: (step >> 32) as u32,
            steps: step as u32,
            ms: now_ms().saturating_sub(since),
        });
        let op = self.op.load(Relaxed) as usize;
        let error = match self.failed.load(Relaxed) {
            true => self.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            false => None,
        };
        ProgressSnapshot {
            comm_id: self.comm_id,
            rank: self.rank,
            nranks: self.nranks,
            coll_started: self.coll_started.load(Relaxed),
            coll_done: self.coll_done.load(Relaxed),
            op: OP_NAMES.get(op).copied().unwrap_or("").to_string(),
            p2p_started: self.p2p_started.load(Relaxed),
            p2p_done: self.p2p_done.load(Relaxed),
            wait,
            error,
        }
    }
}

/// Every live registered record of this process, by communicator and rank.
pub fn snapshot_all() -> Vec<ProgressSnapshot> {
    let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    let mut all: Vec<ProgressSnapshot> = reg
        .iter()
        .filter_map(Weak::upgrade)
        .map(|p| p.snapshot())
        .collect();
    drop(reg);
    all.sort_by_key(|s| (s.comm_id, s.rank));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_ops_and_waits() {
        let p = Progress::new(7, 1, 4);
        let s = p.snapshot();
        assert_eq!((s.coll_started, s.coll_done, s.op.as_str()), (0, 0, ""));
        assert_eq!(s.wait, None);
        p.coll_started(1, 1);
        p.set_wait(WaitPoint {
            step: 3,
            steps: 12,
            on: Some((2, WaitKind::Recv)),
        });
        let s = p.snapshot();
        assert_eq!(
            (s.coll_started, s.coll_done, s.op.as_str()),
            (1, 0, "AllReduce")
        );
        let w = s.wait.unwrap();
        assert_eq!(
            (w.peer, w.kind, w.step, w.steps),
            (2, WaitKind::Recv, 3, 12)
        );
        p.coll_done(1);
        assert_eq!(p.snapshot().wait, None);
        assert_eq!(p.snapshot().coll_done, 1);
        p.p2p_started();
        assert_eq!(p.snapshot().op, "SendRecv");
        p.p2p_done();
        assert_eq!((p.snapshot().p2p_started, p.snapshot().p2p_done), (1, 1));
        p.set_error("first");
        p.set_error("second");
        assert_eq!(p.snapshot().error.as_deref(), Some("first"));
    }

    #[test]
    fn codes_name_collectives_as_nccl_does() {
        use crate::plan::Coll;
        let colls = [
            Coll::AllReduce { count: 1 },
            Coll::ReduceScatter { recv_count: 1 },
            Coll::AllGather { send_count: 1 },
            Coll::Broadcast { count: 1, root: 0 },
            Coll::Reduce { count: 1, root: 0 },
            Coll::AllToAll { count: 1 },
            Coll::Gather { count: 1, root: 0 },
            Coll::Scatter { count: 1, root: 0 },
        ];
        for c in colls {
            assert_eq!(OP_NAMES[coll_code(&c) as usize], c.nccl_name());
        }
    }

    #[test]
    fn registry_lists_live_records_only() {
        let a = Progress::registered(0xfeed_0001, 0, 2);
        let b = Progress::registered(0xfeed_0001, 1, 2);
        let mine = |v: Vec<ProgressSnapshot>| {
            v.into_iter()
                .filter(|s| s.comm_id == 0xfeed_0001)
                .map(|s| s.rank)
                .collect::<Vec<_>>()
        };
        assert_eq!(mine(snapshot_all()), vec![0, 1]);
        drop(a);
        assert_eq!(mine(snapshot_all()), vec![1]);
        drop(b);
        assert!(mine(snapshot_all()).is_empty());
    }
}
