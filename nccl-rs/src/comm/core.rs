//! The state every operation of a communicator goes through, shared by the
//! caller's thread and the async worker: the engine, the bootstrap health
//! channel, the sequence number, recent operations and the first error.
//!
//! # Mismatch detection
//! Every collective's transport tag is a 31-bit fingerprint of its sequence
//! number, collective, datatype, count, op and root, so a rank that meets
//! data of another operation fails at once with a tag mismatch (or a size
//! mismatch), at no cost on the data path. It then asks the root, which asks
//! every rank to describe its operation of that sequence number and sends
//! everyone one message naming the ranks and their calls.

use super::P2P_TAG;
use crate::bootstrap::{Bootstrap, Event};
use crate::datatype::{DataType, RedOp};
use crate::engine::{Call, CallBufs, Engine, OpLabel, Placement, SendStaging};
use crate::error::{Error, Result};
use crate::plan::{Choice, Coll, Planner};
use crate::schedule::{self, Schedule};
use crate::transport::NetError;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Chunk of a broadcast over sockets. It receives straight into the
/// output (no staging slot bounds it), and larger messages cost fewer
/// system calls per byte: 2 ranks, `NCCL_SHM_DISABLE=1`, in place, three
/// interleaved runs, 512 KiB → 2 MiB chunks: 1 MiB 128–133 → 119–122 µs,
/// 4 MiB 562–575 → 446–456 µs, 16 MiB 2.28–2.44 → 1.90–2.41 ms, 64 MiB
/// 11.5–11.8 → 10.0–13.2 ms (medians 2.34 → 1.91 and 11.7 → 10.3 ms);
/// 4 MiB chunks were slower than 2 MiB. (All-gather and all-to-all lost
/// with larger chunks: `NCCL_BUFFSIZE=16M`, 64 MiB.)
const SOCKET_BROADCAST_CHUNK_BYTES: usize = 2 << 20;

/// How many operation descriptions are kept for mismatch reports.
const HISTORY: usize = 64;
/// How many recent schedules are kept for reuse, least recently used out
/// first (training loops repeat a few shapes; rebuilding the schedule would
/// cost more than a small call).
const CACHED_SCHEDULES: usize = 16;

/// A schedule's shape: the planner's choice, pipelined in chunks of that
/// many elements, or the one-hop all-gather.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Chunked(usize),
    DirectAllGather,
    /// An all-to-all in place, in chunks of that many elements
    /// (`schedule::all_to_all_in_place`).
    InPlaceAllToAll(usize),
}

type CacheKey = (Coll, DataType, Shape);

pub(crate) struct Core {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) engine: Engine,
    pub(crate) boot: Bootstrap,
    pub(crate) seq: u64,
    pub(crate) failed: Option<String>,
    /// The last [`HISTORY`] collectives, operation `seq` at `seq % HISTORY`.
    history: Vec<Option<OpLabel>>,
    planner: Planner,
    cache: VecDeque<(CacheKey, Arc<Schedule>)>,
    /// The zero-copy path, where every rank shares this host over shared
    /// memory (see `zero_copy`).
    pub(crate) zero_copy: Option<super::zero_copy::ZeroCopy>,
    /// A copy of an all-to-all's or all-gather's input that is sent from,
    /// reused from call to call (see [`Core::stage_input`]); shared memory,
    /// so that co-located readers map it.
    pub(super) staging: SendStaging,
    /// Ranks talk over sockets: broadcast in [`SOCKET_BROADCAST_CHUNK_BYTES`]
    /// chunks.
    pub(crate) socket_broadcast: bool,
    /// The (collective, algorithm) pairs already named at INFO.
    logged: Vec<(&'static str, Choice)>,
}

impl Core {
    pub(crate) fn new(
        rank: usize,
        nranks: usize,
        engine: Engine,
        boot: Bootstrap,
        planner: Planner,
    ) -> Core {
        Core {
            rank,
            nranks,
            engine,
            boot,
            seq: 0,
            failed: None,
            history: vec![None; HISTORY],
            planner,
            cache: VecDeque::with_capacity(CACHED_SCHEDULES),
            zero_copy: None,
            staging: SendStaging::default(),
            socket_broadcast: false,
            logged: Vec::new(),
        }
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        match &self.failed {
            Some(first) => Err(Error::Poisoned {
                rank: self.rank,
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The schedule of `coll`, pipelined in the engine's chunks.
    pub(super) fn schedule(&mut self, coll: Coll, dtype: DataType) -> Arc<Schedule> {
        let chunk = self.engine.chunk_elems(dtype.size());
        self.schedule_shaped(coll, dtype, Shape::Chunked(chunk))
            .expect("a chunked schedule always exists")
    }

    /// The schedule of `coll` in `shape` (cached); `None` if the planner
    /// rules that shape out.
    fn schedule_shaped(
        &mut self,
        coll: Coll,
        dtype: DataType,
        shape: Shape,
    ) -> Option<Arc<Schedule>> {
        let entry = self.take_cached(coll, dtype, shape)?;
        let sched = entry.1.clone();
        self.cache.push_back(entry);
        Some(sched)
    }

    /// Takes the cache entry of `coll` in `shape` out of the cache (planning
    /// it if absent, evicting the least recently used entry if full); the
    /// caller puts it back at the most recently used end. `None` if the
    /// planner rules that shape out.
    fn take_cached(
        &mut self,
        coll: Coll,
        dtype: DataType,
        shape: Shape,
    ) -> Option<(CacheKey, Arc<Schedule>)> {
        let key = (coll, dtype, shape);
        // Usually the last entry: a loop repeats its call.
        if let Some(i) = self.cache.iter().rposition(|(k, _)| *k == key) {
            return self.cache.remove(i);
        }
        let (n, r) = (self.nranks, self.rank);
        let (sched, choice) = match shape {
            Shape::Chunked(chunk) => (
                self.planner.plan(coll, n, r, dtype, chunk),
                self.planner.choice(coll, n, dtype),
            ),
            Shape::DirectAllGather => (
                self.planner.plan_direct_all_gather(coll, n, r)?,
                Choice::DIRECT,
            ),
            Shape::InPlaceAllToAll(chunk) => match coll {
                Coll::AllToAll { count } => (
                    schedule::all_to_all_in_place(n, r, count, chunk),
                    Choice::PAIRWISE,
                ),
                _ => return None,
            },
        };
        self.log_choice(coll, choice);
        let sched = Arc::new(sched);
        if self.cache.len() >= CACHED_SCHEDULES {
            self.cache.pop_front();
        }
        Some((key, sched))
    }

    /// Names the algorithm of `coll` at INFO the first time this
    /// communicator runs it: a line per (collective, algorithm), not per
    /// call or size, so the log says what ran without flooding.
    fn log_choice(&mut self, coll: Coll, choice: Choice) {
        let key = (coll.nccl_name(), choice);
        if self.logged.contains(&key) {
            return;
        }
        self.logged.push(key);
        tracing::info!(
            rank = self.rank,
            "{}: algorithm {}, protocol {}, {} ranks",
            key.0,
            choice.algo,
            choice.proto,
            self.nranks
        );
    }

    /// Plans and runs one collective on raw buffers: the one path of every
    /// collective, blocking or async.
    pub(crate) fn collective(
        &mut self,
        coll: Coll,
        dtype: DataType,
        op: RedOp,
        bufs: CallBufs,
    ) -> Result<()> {
        // Lines logged on this thread during the call name this rank.
        let _rank = crate::logging::OpRank::enter(self.rank);
        self.check_usable()?;
        self.seq += 1;
        let label = OpLabel::Coll {
            coll,
            dtype,
            op,
            seq: self.seq,
        };
        self.history[(self.seq % HISTORY as u64) as usize] = Some(label);
        let tag = label.fingerprint() & !P2P_TAG;
        if self.zero_copy.is_some() && self.try_zero_copy(coll, dtype, op, &bufs, tag, label)? {
            return Ok(());
        }
        // Between two ranks, where their CPUs are decides an all-to-all's
        // shape (the ring only while they share a cache; in place it sends
        // from staging and keeps single copy: whether a rank is in place is
        // its own, so the probe trades it), and found apart, the ring
        // writes of all-gather and all-reduce stream
        // (`CopyHint::receiver_apart`).
        let (probes, ring_ok) = match coll {
            Coll::AllGather { .. } | Coll::AllReduce { .. } => (true, true),
            Coll::AllToAll { .. } => (true, !bufs.input.overlaps(bufs.output)),
            _ => (false, false),
        };
        let watch = probes && self.engine.single_copy.watches_placement(bufs.output.len);
        self.engine.single_copy.placement = match watch {
            true => self.probe_placement(tag, label, ring_ok)?,
            false => Placement::Unknown,
        };
        let (bufs, in_place) = self.stage_input(coll, bufs);
        // One message per peer where it goes single-copy (all ranks agree):
        // each chunk would cost a handshake (and for a split broadcast, an
        // offer and claims; 2 ranks, 64 MiB in place: 5.7–6.0 ms in 512 KiB
        // chunks, 4.9 ms whole).
        let policy = self.engine.single_copy;
        let bytes = bufs.output.len;
        let chunked = Shape::Chunked(self.engine.chunk_elems(dtype.size()));
        let shape = match coll {
            Coll::AllToAll { count } if policy.whole_blocks(bytes) => Shape::Chunked(count.max(1)),
            Coll::AllGather { .. } if policy.whole_block_all_gather(bytes) => {
                Shape::DirectAllGather
            }
            Coll::Broadcast { count, .. } if policy.split_broadcast() => {
                Shape::Chunked(count.max(1))
            }
            Coll::Broadcast { .. } if self.socket_broadcast => {
                Shape::Chunked((SOCKET_BROADCAST_CHUNK_BYTES / dtype.size()).max(1))
            }
            _ => chunked,
        };
        let shape = match (shape, in_place) {
            (Shape::Chunked(chunk), true) => Shape::InPlaceAllToAll(chunk),
            (shape, _) => shape,
        };
        let entry = match self.take_cached(coll, dtype, shape) {
            Some(e) => e,
            None => self
                .take_cached(coll, dtype, chunked)
                .expect("a chunked schedule always exists"),
        };
        // Run straight from the cache entry, moved out and back: cloning
        // the `Arc` would count a reference per call.
        let res = self.execute(&entry.1, dtype, op, tag, label, bufs);
        self.cache.push_back(entry);
        res
    }

    pub(crate) fn execute(
        &mut self,
        sched: &Schedule,
        dtype: DataType,
        op: RedOp,
        tag: u32,
        what: OpLabel,
        bufs: CallBufs,
    ) -> Result<()> {
        let _rank = crate::logging::OpRank::enter(self.rank);
        self.check_usable()?;
        let Core {
            rank,
            engine,
            boot,
            history,
            seq,
            ..
        } = self;
        let (rank, seq) = (*rank, *seq);
        let describe = |s: u64| {
            history
                .iter()
                .flatten()
                .find(|l| matches!(l, OpLabel::Coll { seq, .. } if *seq == s))
                .map(OpLabel::call)
                .unwrap_or_else(|| format!("no operation #{s} (its last was #{seq})"))
        };
        let to_error = |ev: Event| match ev {
            Event::RemoteFailure(msg) => Error::Remote { rank, msg },
            Event::Mismatch(msg) => Error::InvalidUsage(format!("rank {rank}: {msg}")),
        };
        let call = Call {
            sched,
            dtype,
            op,
            tag,
            what,
        };
        let mut health = || boot.check(&describe).map(to_error);
        let mut res = engine.run(call, bufs, &mut health);
        if let Err(e) = &res {
            let mismatch = matches!(
                e,
                Error::Transport {
                    source: NetError::TagMismatch { .. }
                        | NetError::Truncated { .. }
                        | NetError::Protocol(_),
                    ..
                }
            );
            if mismatch && tag != P2P_TAG {
                boot.report_mismatch(seq, &describe(seq));
                if let Some(ev) = boot.await_event(Duration::from_secs(5), &describe) {
                    res = Err(to_error(ev));
                }
            } else if !matches!(e, Error::Remote { .. } | Error::InvalidUsage(_)) {
                // A broken connection is usually the echo of something the
                // root is about to explain (a rank died, a mismatch ended
                // another rank): prefer its explanation if it comes soon.
                match boot.await_event(Duration::from_millis(500), &describe) {
                    Some(ev) => res = Err(to_error(ev)),
                    None => boot.report_failure(&e.to_string()),
                }
            }
        }
        if let Err(e) = &res {
            tracing::warn!(rank = self.rank, "{e}");
            self.failed = Some(e.to_string());
        }
        res
    }
}
