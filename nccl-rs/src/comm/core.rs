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
use crate::engine::{Call, CallBufs, Engine, Hints, OpLabel, Region, SendStaging};
use crate::error::{Error, Result};
use crate::observe::progress::{self, Progress};
use crate::plan::call::Shaped;
use crate::plan::call::{self, placement_matters, plan_call};
use crate::plan::{
    CallFacts, CallPlan, Choice, Coll, Placement, PlacementSource, Planner, SchedFacts, Shape,
    Stores, Topology,
};
use crate::profiler::CollInfo;
use crate::schedule::{self, Schedule};
use crate::transport::{CopyHint, NetError, RecvHint};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// How many operation descriptions are kept for mismatch reports.
const HISTORY: usize = 64;
/// How many recent schedules are kept for reuse, least recently used out
/// first (training loops repeat a few shapes; rebuilding the schedule would
/// cost more than a small call).
const CACHED_SCHEDULES: usize = 16;

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
    /// What does not change from call to call (see `plan::call`).
    pub(crate) topo: Topology,
    /// Where the peer's CPU is, per call (`NCCL_RS_PLACEMENT`).
    placement: Box<dyn PlacementSource>,
    /// Calls whose plan depended on placement, and the last verdict.
    placement_calls: u64,
    last_placement: Placement,
    cache: VecDeque<(CacheKey, Arc<Schedule>, Shaped)>,
    /// The last collective's facts, placement and plan.
    last_plan: Option<(CallFacts, Placement, CallPlan)>,
    /// The zero-copy path, where every rank shares this host over shared
    /// memory (see `zero_copy`).
    pub(crate) zero_copy: Option<super::zero_copy::ZeroCopy>,
    /// A copy of an all-to-all's or all-gather's input that is sent from,
    /// reused from call to call (see [`Core::stage_input`]); shared memory,
    /// so that co-located readers map it.
    pub(super) staging: SendStaging,
    /// The (collective, algorithm) pairs already named at INFO.
    logged: Vec<(&'static str, Choice)>,
    /// What RAS reports of this rank (see `observe::progress`).
    pub(crate) progress: Arc<Progress>,
    /// The profiler plugin's context (`NCCL_PROFILER_PLUGIN`; `None`: none).
    pub(crate) profiler: Option<Box<crate::profiler::CommProfiler>>,
}

impl Core {
    pub(crate) fn new(
        rank: usize,
        nranks: usize,
        engine: Engine,
        boot: Bootstrap,
        planner: Planner,
        topo: Topology,
        placement: Box<dyn PlacementSource>,
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
            last_placement: topo.placement,
            topo,
            placement,
            placement_calls: 0,
            cache: VecDeque::with_capacity(CACHED_SCHEDULES),
            last_plan: None,
            zero_copy: None,
            staging: SendStaging::default(),
            logged: Vec::new(),
            progress: Arc::new(Progress::new(0, rank, nranks)),
            profiler: None,
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
        self.cached(coll, dtype, Shape::Chunked(chunk)).0
    }

    /// The schedule of `coll` in `shape` and what it does (see [`cached`]).
    fn cached(&mut self, coll: Coll, dtype: DataType, shape: Shape) -> (Arc<Schedule>, Shaped) {
        let (n, r) = (self.nranks, self.rank);
        let (shaped, _) = cached(&mut self.cache, &self.planner, (n, r), coll, dtype, shape);
        let sched = self.cache.back().expect("just cached").1.clone();
        (sched, shaped)
    }

    /// Names the algorithm of `coll` at INFO the first time this
    /// communicator runs it: a line per (collective, algorithm), not per
    /// call or size, so the log says what ran without flooding.
    /// With it, the planner's predicted time for this first call's size.
    fn log_choice(&mut self, coll: Coll, choice: Choice, bytes: usize) {
        let key = (coll.nccl_name(), choice);
        if self.logged.contains(&key) {
            return;
        }
        self.logged.push(key);
        let predicted = match self.planner.predict(coll, self.nranks, bytes) {
            Some(t) => format!(", predicted {:.1} us for {bytes} B", t * 1e6),
            None => String::new(),
        };
        tracing::info!(
            rank = self.rank,
            "{}: algorithm {}, protocol {}, {} ranks{predicted}",
            key.0,
            choice.algo,
            choice.proto,
            self.nranks
        );
    }

    /// The communicator's placement source.
    pub(super) fn placement_source(&self) -> &dyn PlacementSource {
        &*self.placement
    }

    /// What the plan needs to know of a call's buffers.
    fn facts(&self, coll: Option<Coll>, dtype: DataType, bufs: &CallBufs) -> CallFacts {
        let (input, output) = (bufs.input, bufs.output);
        let heap = |r: Region| {
            crate::hostmem::locate(r.ptr, r.len).is_none()
                && !crate::hostmem::registered_huge(r.ptr, r.len)
        };
        CallFacts {
            coll,
            dtype,
            in_bytes: input.len,
            out_bytes: output.len + bufs.group.iter().map(|r| r.len).sum::<usize>(),
            overlaps: input.overlaps(output),
            in_place: input.ptr.cast_const() == output.ptr.cast_const(),
            exact_in_place: input.ptr.cast_const() == output.ptr.cast_const()
                && input.len == output.len
                && input.len % self.nranks.max(1) == 0,
            // Asked only where it can matter (staging needs single copy on
            // every peer): the lookups are not free.
            input_heap: coll.is_some_and(|c| call::may_stage(&self.topo, c, input.len))
                && heap(input),
            sends_mapped: false,
        }
    }

    /// The placement `facts`' plan uses: measured where this call's plan
    /// depends on it and its turn has come (both ranks take part), the last
    /// verdict where it depends on it otherwise, else the topology's.
    fn placement_for(&mut self, facts: &CallFacts, tag: u32, label: OpLabel) -> Result<Placement> {
        let Some(measure) = placement_matters(&self.topo, facts, self.placement_calls) else {
            return Ok(self.topo.placement);
        };
        self.placement_calls += 1;
        if !self.placement.measures() {
            return Ok(self.placement.judge(None));
        }
        if measure {
            // A side of an all-to-all in place cannot take the ring: the
            // ranks trade that, since both must cut its messages alike.
            let ring_ok = !matches!(facts.coll, Some(Coll::AllToAll { .. })) || !facts.overlaps;
            self.last_placement = self.probe_placement(tag, label, ring_ok)?;
        }
        Ok(self.last_placement)
    }

    /// Plans and runs one collective on raw buffers: the one path of every
    /// collective, blocking or async. Its latency goes to the telemetry.
    pub(crate) fn collective(
        &mut self,
        coll: Coll,
        dtype: DataType,
        op: RedOp,
        bufs: CallBufs,
    ) -> Result<()> {
        // An empty call moves nothing: not counted. Of the others, a
        // sample is timed (`LATENCY_SAMPLE`).
        let counted = coll.bytes(self.nranks, dtype) > 0;
        let (res, took) = match counted && self.engine.telemetry.times_next(coll.index()) {
            true => self.timed_collective(coll, dtype, op, bufs),
            false => (self.run_collective(coll, dtype, op, bufs), None),
        };
        if res.is_ok() {
            if counted {
                self.engine.telemetry.observe(coll.index(), took);
            }
            self.progress.coll_done(self.seq);
        }
        res
    }

    /// A call of the latency sample, and how long it took (out of line:
    /// the clock stays off the path of the calls not timed).
    #[inline(never)]
    fn timed_collective(
        &mut self,
        coll: Coll,
        dtype: DataType,
        op: RedOp,
        bufs: CallBufs,
    ) -> (Result<()>, Option<Duration>) {
        let start = crate::observe::clock::now();
        let res = self.run_collective(coll, dtype, op, bufs);
        (res, Some(crate::observe::clock::since(start)))
    }

    /// Plans a call whose facts or placement differ from the last one's
    /// (out of line: a loop repeating its call never comes here).
    #[inline(never)]
    fn plan_afresh(
        &mut self,
        coll: Coll,
        dtype: DataType,
        label: OpLabel,
        facts: CallFacts,
        placement: Placement,
    ) -> CallPlan {
        let (n, r) = (self.nranks, self.rank);
        let mut fresh = false;
        let plan = plan_call(&self.planner, &self.topo, &facts, placement, &mut |shape| {
            let (shaped, missed) =
                cached(&mut self.cache, &self.planner, (n, r), coll, dtype, shape);
            fresh |= missed;
            shaped
        });
        if fresh {
            // A new shape: name its algorithm (once per communicator).
            self.log_choice(coll, plan.algo, coll.bytes(n, dtype));
            tracing::trace!(
                rank = self.rank,
                ?placement,
                ?plan,
                "plan of {}",
                label.call()
            );
        }
        self.last_plan = Some((facts, placement, plan));
        plan
    }

    // One copy, shared by the timed and the untimed path.
    #[inline(never)]
    fn run_collective(
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
        self.progress
            .coll_started(self.seq, progress::coll_code(&coll));
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
        let facts = self.facts(Some(coll), dtype, &bufs);
        let placement = self.placement_for(&facts, tag, label)?;
        let (n, r) = (self.nranks, self.rank);
        // The plan is a pure function of the facts and the placement (the
        // planner and topology do not change): a loop repeating its call
        // reuses the last one.
        let plan = match self.last_plan {
            Some((f, p, plan)) if f == facts && p == placement => plan,
            _ => self.plan_afresh(coll, dtype, label, facts, placement),
        };
        // The plan's shape was the last one asked for: its entry is at the
        // back. Run straight from it, moved out and back (cloning the `Arc`
        // would count a reference per call).
        let key = (coll, dtype, plan.shape);
        if self.cache.back().is_none_or(|e| e.0 != key) {
            cached(
                &mut self.cache,
                &self.planner,
                (n, r),
                coll,
                dtype,
                plan.shape,
            );
        }
        let entry = self.cache.pop_back().expect("just cached");
        if let Some(p) = self.profiler.as_deref_mut() {
            self.engine.trace = p.coll(&CollInfo::of(coll, dtype, &bufs, &plan), &entry.1);
        }
        let bufs = self.stage(plan.staging, plan.staging_plain_for, bufs);
        let hints = hints_of(&plan, &bufs);
        let res = self.execute(&entry.1, dtype, op, tag, label, bufs, hints);
        if let Some(p) = self.profiler.as_deref_mut() {
            p.finish(self.engine.trace.take());
        }
        self.cache.push_back(entry);
        res
    }

    /// Plans and runs a group of sends and receives (`ops`, of element
    /// types `dtypes`, for the profiler).
    pub(crate) fn group(
        &mut self,
        sched: &Schedule,
        what: OpLabel,
        bufs: CallBufs,
        (ops, dtypes): (&[schedule::P2pOp], &[DataType]),
    ) -> Result<()> {
        let kind = crate::observe::telemetry::SEND_RECV;
        let start = self
            .engine
            .telemetry
            .times_next(kind)
            .then(crate::observe::clock::now);
        let mut facts = self.facts(None, DataType::Uint8, &bufs);
        facts.sends_mapped = SchedFacts::sends_from(sched, |loc| {
            let r = match loc {
                schedule::Loc::In(_) => Some(bufs.input),
                schedule::Loc::Out(_) => Some(bufs.output),
                schedule::Loc::Group(b, _) => bufs.group.get(b).copied(),
                schedule::Loc::Scratch(_) => None,
            };
            r.is_some_and(|r| r.len > 0 && crate::hostmem::locate(r.ptr, r.len).is_some())
        });
        let shaped = Shaped {
            facts: SchedFacts::of(sched),
            algo: Choice::RING,
        };
        let plan = plan_call(
            &self.planner,
            &self.topo,
            &facts,
            self.last_placement,
            &mut |_| shaped,
        );
        let hints = hints_of(&plan, &bufs);
        self.progress.p2p_started();
        if let Some(p) = self.profiler.as_deref_mut() {
            self.engine.trace = p.p2p(ops, dtypes, &bufs.group, sched);
        }
        let res = self.execute(
            sched,
            DataType::Uint8,
            RedOp::Sum,
            P2P_TAG,
            what,
            bufs,
            hints,
        );
        if res.is_ok() {
            let took = start.map(crate::observe::clock::since);
            self.engine.telemetry.observe(kind, took);
            self.progress.p2p_done();
        }
        if let Some(p) = self.profiler.as_deref_mut() {
            p.finish(self.engine.trace.take());
        }
        res
    }

    /// Runs `sched` as operation `what` with the transports told `hints`.
    #[allow(clippy::too_many_arguments)] // one call's parts, each used once
    pub(crate) fn execute(
        &mut self,
        sched: &Schedule,
        dtype: DataType,
        op: RedOp,
        tag: u32,
        what: OpLabel,
        bufs: CallBufs,
        hints: Hints,
    ) -> Result<()> {
        let _rank = crate::logging::OpRank::enter(self.rank);
        self.check_usable()?;
        let Core {
            rank,
            engine,
            boot,
            history,
            seq,
            progress,
            ..
        } = self;
        let (rank, seq) = (*rank, *seq);
        let history = &*history;
        let describe = |s: u64| describe_op(history, seq, s);
        let call = Call {
            sched,
            dtype,
            op,
            tag,
            what,
            hints,
        };
        let mut health = |at| {
            progress.set_wait(at);
            boot.check(&describe).map(|ev| event_error(rank, ev))
        };
        let res = engine.run(call, bufs, &mut health);
        match res {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failed_with(e, tag)),
        }
    }

    /// Records that the operation now run failed with `e` and returns the
    /// error to report: the root's explanation where one comes soon (a
    /// mismatch, a rank that died), else `e`. Out of line: off the path of
    /// the calls that succeed.
    #[cold]
    #[inline(never)]
    fn failed_with(&mut self, e: Error, tag: u32) -> Error {
        let (rank, seq) = (self.rank, self.seq);
        let Core { boot, history, .. } = self;
        let history = &*history;
        let describe = |s: u64| describe_op(history, seq, s);
        let mismatch = matches!(
            e,
            Error::Transport {
                source: NetError::TagMismatch { .. }
                    | NetError::Truncated { .. }
                    | NetError::Protocol(_),
                ..
            }
        );
        let mut e = e;
        if mismatch && tag != P2P_TAG {
            boot.report_mismatch(seq, &describe(seq));
            if let Some(ev) = boot.await_event(Duration::from_secs(5), &describe) {
                e = event_error(rank, ev);
            }
        } else if !matches!(e, Error::Remote { .. } | Error::InvalidUsage(_)) {
            // A broken connection is usually the echo of something the
            // root is about to explain (a rank died, a mismatch ended
            // another rank): prefer its explanation if it comes soon.
            match boot.await_event(Duration::from_millis(500), &describe) {
                Some(ev) => e = event_error(rank, ev),
                None => boot.report_failure(&e.to_string()),
            }
        }
        tracing::warn!(rank = self.rank, "{e}");
        self.failed = Some(e.to_string());
        self.progress.set_error(&e.to_string());
        e
    }
}

/// How operation `s` was called, from the last [`HISTORY`] collectives
/// (`seq`: the newest).
fn describe_op(history: &[Option<OpLabel>], seq: u64, s: u64) -> String {
    history
        .iter()
        .flatten()
        .find(|l| matches!(l, OpLabel::Coll { seq, .. } if *seq == s))
        .map(OpLabel::call)
        .unwrap_or_else(|| format!("no operation #{s} (its last was #{seq})"))
}

/// The error rank `rank` reports for an event from the bootstrap root.
fn event_error(rank: usize, ev: Event) -> Error {
    match ev {
        Event::RemoteFailure(msg) => Error::Remote { rank, msg },
        Event::Mismatch(msg) => Error::InvalidUsage(format!("rank {rank}: {msg}")),
    }
}

/// What the schedule of `coll` in `shape` for rank `at.1` of `at.0` does,
/// and whether it was planned just now; its entry is left at the back of
/// `cache` (planned if absent; the least recently used entry leaves a full
/// cache).
fn cached(
    cache: &mut VecDeque<(CacheKey, Arc<Schedule>, Shaped)>,
    planner: &Planner,
    at: (usize, usize),
    coll: Coll,
    dtype: DataType,
    shape: Shape,
) -> (Shaped, bool) {
    let key = (coll, dtype, shape);
    // Usually the last entry: a loop repeats its call.
    if let Some(i) = cache.iter().rposition(|(k, ..)| *k == key) {
        if i + 1 != cache.len() {
            let entry = cache.remove(i).expect("found");
            cache.push_back(entry);
        }
        let (.., shaped) = cache.back().expect("just there");
        return (*shaped, false);
    }
    let sched = Arc::new(call::schedule_of(planner, coll, shape, at.0, at.1, dtype));
    let shaped = Shaped::of(planner, coll, shape, at.0, dtype, &sched);
    if cache.len() >= CACHED_SCHEDULES {
        cache.pop_front();
    }
    cache.push_back((key, sched, shaped));
    (shaped, true)
}

/// The transports' hints of a plan, for a call on `bufs`.
fn hints_of(plan: &CallPlan, bufs: &CallBufs) -> Hints {
    let m = plan.messages;
    let out = bufs.output;
    let start = out.ptr as usize;
    Hints {
        send: CopyHint {
            single_copy: m.single_copy,
            buffered_max: m.ring_max,
            sender_idle: m.sender_idle,
            receives: m.receives,
            streaming_stores: m.ring_stores == Stores::Streaming,
        },
        recv: match m.recv_stores {
            Stores::Streaming if out.len > 0 => RecvHint {
                stream: (start, start.saturating_add(out.len)),
            },
            _ => RecvHint::default(),
        },
        stream_copies: m.copy_stores == Stores::Streaming,
    }
}
