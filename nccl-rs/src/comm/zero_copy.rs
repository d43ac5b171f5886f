//! Zero-copy collectives between co-located ranks whose buffers are shared
//! host memory ([`crate::ShmBuffer`], `ncclMemAlloc`): every rank maps its
//! peers' buffers and the collective runs as a plan of direct reads and
//! writes ([`crate::schedule::zero_copy`]), with no transport copy.
//!
//! A call on a communicator whose ranks all share one host over the
//! shared-memory transport (and `NCCL_LOCAL_REGISTER` not 0), moving at
//! least `NCCL_RS_ZERO_COPY_MIN_BYTES`, goes:
//! 1. all-gather of every rank's buffer descriptor (pid, allocation, offset,
//!    length; zeros where a buffer is not shared memory) over the transport:
//!    also the entry barrier (no rank touches a peer's buffer before the
//!    peer is in the call);
//! 2. if every rank described shared buffers, each maps its peers'
//!    allocations (cached); the first time, all agree by a one-word
//!    all-reduce (min) that every rank could, else all fall back;
//! 3. the plan runs;
//! 4. a one-word all-reduce (max of "my part failed") is the exit barrier:
//!    no rank returns, and reuses its buffers, while a peer still reads or
//!    writes them, and every rank learns whether all parts ran.
//!
//! Every decision is taken from data all ranks share, so they all take the
//! same path; otherwise (a buffer not shared, a mapping refused) they all
//! fall back to the transport schedules of the same call, and after a
//! refused first mapping they all stop trying on this communicator. The
//! extra cost is two tiny collectives (three the first time), which is why
//! small calls skip it.
//!
//! A communicator used with heap buffers would pay the descriptor exchange,
//! a large share of a small call's time, on every call for nothing. So
//! after an exchange shows a rank's buffers not shared, every rank skips
//! the path for the next 1, 2, 4, … up to [`MAX_SKIP`] eligible calls,
//! doubling while it keeps failing and starting over once it runs. All
//! ranks saw the same descriptors and count the same eligible calls, so
//! they skip the same ones.

use super::core::Core;
use crate::datatype::{DataType, RedOp};
use crate::engine::zero_copy::{self as exec, RankBufs};
use crate::engine::{AlignedBuf, CallBufs, Hints, OpLabel, Region};
use crate::error::{Error, Result};
use crate::hostmem::{BufferDesc, PeerMaps, DESC_WORDS};
use crate::plan::Coll;
use crate::profiler::CollInfo;
use crate::schedule::{all_gather_direct, zero_copy, Schedule, ZcColl};
use std::sync::Arc;

/// Per-communicator state of the zero-copy path.
pub(crate) struct ZeroCopy {
    min_bytes: usize,
    maps: PeerMaps,
    descs: Vec<u64>,
    tmp: AlignedBuf,
    /// Whether all ranks once mapped all peers' buffers (then a later
    /// mapping failure fails the call instead of falling back).
    agreed: bool,
    /// The descriptor exchange's schedule (always the same shape).
    gather: Option<Arc<Schedule>>,
    /// Eligible calls still to skip, and the length of the last skip.
    skip: u32,
    backoff: u32,
}

/// Longest run of eligible calls skipped after finding a buffer not shared.
pub(crate) const MAX_SKIP: u32 = 64;

impl ZeroCopy {
    pub(crate) fn new(min_bytes: usize) -> ZeroCopy {
        ZeroCopy {
            min_bytes,
            maps: PeerMaps::default(),
            descs: Vec::new(),
            tmp: AlignedBuf::default(),
            agreed: false,
            gather: None,
            skip: 0,
            backoff: 0,
        }
    }
}

/// The zero-copy form of `coll` and the bytes it moves per rank.
fn zc_coll(coll: Coll, n: usize) -> Option<(ZcColl, usize)> {
    Some(match coll {
        Coll::AllReduce { count } => (ZcColl::AllReduce { count }, count),
        Coll::ReduceScatter { recv_count } => {
            (ZcColl::ReduceScatter { recv_count }, recv_count * n)
        }
        Coll::AllGather { send_count } => (ZcColl::AllGather { send_count }, send_count * n),
        Coll::Broadcast { count, root } => (
            ZcColl::Broadcast {
                count,
                root,
                root_shares: false,
            },
            count,
        ),
        Coll::Reduce { count, root } => (ZcColl::Reduce { count, root }, count),
        Coll::AllToAll { count } => (ZcColl::AllToAll { count }, count * n),
        Coll::Gather { count, root } => (ZcColl::Gather { count, root }, count * n),
        Coll::Scatter { count, root } => (ZcColl::Scatter { count, root }, count * n),
    })
}

impl Core {
    /// Runs `coll` by the zero-copy path if every rank can; `Ok(false)`
    /// when the caller must run the transport schedule instead.
    pub(crate) fn try_zero_copy(
        &mut self,
        coll: Coll,
        dtype: DataType,
        op: RedOp,
        bufs: &CallBufs,
        tag: u32,
        what: OpLabel,
    ) -> Result<bool> {
        let n = self.nranks;
        let Some(zc) = self.zero_copy.as_ref() else {
            return Ok(false);
        };
        let Some((zcoll, elems)) = zc_coll(coll, n) else {
            return Ok(false);
        };
        if elems * dtype.size() < zc.min_bytes.max(1) {
            return Ok(false);
        }
        if zc.skip > 0 {
            self.zero_copy.as_mut().expect("checked").skip -= 1;
            return Ok(false);
        }
        self.run_zero_copy(coll, zcoll, dtype, op, bufs, tag, what)
    }

    /// The zero-copy call [`Core::try_zero_copy`] chose; out of line, so
    /// that the calls it declines keep a short path.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)] // the call's parts, as passed in
    fn run_zero_copy(
        &mut self,
        coll: Coll,
        zcoll: ZcColl,
        dtype: DataType,
        op: RedOp,
        bufs: &CallBufs,
        tag: u32,
        what: OpLabel,
    ) -> Result<bool> {
        let (n, r) = (self.nranks, self.rank);
        let mine = BufferDesc::of(
            (bufs.input.ptr.cast_const(), bufs.input.len),
            (bufs.output.ptr.cast_const(), bufs.output.len),
        );

        // 1. Descriptors (and entry barrier).
        let mut descs = std::mem::take(&mut self.zero_copy.as_mut().expect("checked").descs);
        descs.clear();
        descs.resize(DESC_WORDS * n, 0);
        descs[r * DESC_WORDS..(r + 1) * DESC_WORDS].copy_from_slice(&BufferDesc::encode(mine));
        let gathered = self.tiny(
            Coll::AllGather {
                send_count: DESC_WORDS,
            },
            RedOp::Sum,
            &mut descs,
            r * DESC_WORDS,
            tag,
            what,
        );
        let all: Option<Vec<BufferDesc>> =
            descs.chunks(DESC_WORDS).map(BufferDesc::decode).collect();
        let zc = self.zero_copy.as_mut().expect("checked");
        zc.descs = descs;
        gathered?;
        let Some(all) = all else {
            zc.backoff = (zc.backoff * 2).clamp(1, MAX_SKIP);
            zc.skip = zc.backoff;
            return Ok(false);
        };
        zc.backoff = 0;
        // In-place all-to-all: a rank would overwrite input its peers still
        // read, so with every rank exactly in place the ranks swap blocks
        // pairwise; with only some (or a partial overlap) they all fall
        // back (this call only). Every rank sees that alike.
        let zcoll = match zcoll {
            ZcColl::AllToAll { count } if all.iter().all(BufferDesc::exactly_in_place) => {
                ZcColl::AllToAllInPlace { count }
            }
            ZcColl::AllToAll { .. } if all.iter().any(BufferDesc::in_place) => return Ok(false),
            z => z,
        };
        // An in-place broadcast root has no copy of its own to make: it
        // copies a share of the others' (every rank sees that alike).
        let zcoll = match zcoll {
            ZcColl::Broadcast { count, root, .. } => ZcColl::Broadcast {
                count,
                root,
                root_shares: all[root].in_place(),
            },
            z => z,
        };

        // 2. Map every peer's buffers; agree.
        let zc = self.zero_copy.as_mut().expect("checked");
        let in_use: Vec<(i32, u64)> = all
            .iter()
            .flat_map(|d| [(d.pid, d.input.serial), (d.pid, d.output.serial)])
            .collect();
        let mut ranks = Vec::with_capacity(n);
        let mut refused = None;
        for (q, d) in all.iter().enumerate() {
            if q == r {
                ranks.push((bufs.input, bufs.output));
                continue;
            }
            let mut region = |rd: &crate::hostmem::RegionDesc| {
                zc.maps
                    .resolve(d.pid, rd, &in_use)
                    .map(|p| Region::new(p, rd.len))
            };
            match (region(&d.input), region(&d.output)) {
                (Ok(i), Ok(o)) => ranks.push((i, o)),
                (Err(e), _) | (_, Err(e)) => {
                    refused = Some(format!("rank {q}: {e}"));
                    break;
                }
            }
        }
        if !zc.agreed {
            // The first time: agree (all ranks could map all peers), so a
            // communicator whose ranks may not map each other (ptrace rules)
            // falls back instead of failing.
            if let Some(why) = &refused {
                tracing::info!(
                    rank = r,
                    "SHM zero copy: cannot map a peer's buffer ({why}); using the transport"
                );
            }
            let mut ok = [u64::from(refused.is_none())];
            self.tiny(
                Coll::AllReduce { count: 1 },
                RedOp::Min,
                &mut ok,
                0,
                tag,
                what,
            )?;
            if ok[0] == 0 {
                // Every rank saw the same answer: all stop trying (the
                // mapping rules do not change while the processes live).
                self.zero_copy = None;
                return Ok(false);
            }
            let zc = self.zero_copy.as_mut().expect("checked");
            zc.agreed = true;
            if r == 0 {
                tracing::info!(
                    "SHM zero copy: collectives on shared buffers copy straight between ranks"
                );
            }
        }

        // 3. The plan (not where this rank could not map a peer: a resource
        // failure once mapping is known to work; every rank then fails the
        // call at the exit barrier).
        if let Some(p) = self.profiler.as_deref_mut() {
            self.engine.trace = p.zero_copy(&CollInfo::zero_copy(coll, dtype, bufs));
        }
        let zc = self.zero_copy.as_mut().expect("checked");
        let ran = match refused {
            Some(why) => Err(format!("cannot map a peer's buffer: {why}")),
            None => {
                let steps = zero_copy(zcoll, n, r);
                let b = RankBufs {
                    bufs: &ranks,
                    dtype,
                    own_output_len: bufs.output.len,
                };
                // SAFETY: our own regions come from the caller's `CallBufs`
                // (valid for the call); the peers' are their descriptors'
                // ranges inside allocations mapped whole into this process,
                // and every peer is inside the same call until the exit
                // barrier below (entered: step 1; leaves: step 4), running
                // its part of the same plan.
                let ran = unsafe { exec::run(&steps, &b, op, n, &mut zc.tmp) };
                if ran.is_ok() {
                    self.engine.telemetry.zero_copy(&steps, dtype.size());
                }
                ran
            }
        };
        // 4. Exit barrier, which also tells every rank whether all parts ran.
        let mut failed = [u64::from(ran.is_err())];
        let barrier = self.tiny(
            Coll::AllReduce { count: 1 },
            RedOp::Max,
            &mut failed,
            0,
            tag,
            what,
        );
        if let Some(p) = self.profiler.as_deref_mut() {
            p.finish(self.engine.trace.take());
        }
        barrier?;
        let fail = |msg: String| Error::Internal {
            rank: r,
            msg: format!("{}: zero copy: {msg}", what.call()),
        };
        ran.map_err(fail)?;
        if failed[0] != 0 {
            return Err(fail("another rank could not run its part".into()));
        }
        Ok(true)
    }

    /// Runs a tiny internal collective of `u64` words: `words` is the whole
    /// output, this rank's input at `mine` (in place).
    fn tiny(
        &mut self,
        coll: Coll,
        op: RedOp,
        words: &mut [u64],
        mine: usize,
        tag: u32,
        what: OpLabel,
    ) -> Result<()> {
        let sched = match coll {
            // The descriptors: one hop (a ring would take n - 1).
            Coll::AllGather { send_count } => {
                let (n, r) = (self.nranks, self.rank);
                let zc = self.zero_copy.as_mut().expect("only on the zero-copy path");
                zc.gather
                    .get_or_insert_with(|| Arc::new(all_gather_direct(n, r, send_count)))
                    .clone()
            }
            _ => self.schedule(coll, DataType::Uint64),
        };
        let bytes = std::mem::size_of_val(words);
        let out = Region::new(words.as_mut_ptr().cast(), bytes);
        let count = match coll {
            Coll::AllGather { send_count } => send_count,
            _ => words.len(),
        };
        let input = Region::new(out.ptr.wrapping_add(mine * 8), count * 8);
        self.engine.control = true;
        let res = self.execute(
            &sched,
            DataType::Uint64,
            op,
            tag,
            what,
            CallBufs {
                input,
                output: out,
                group: Vec::new(),
            },
            Hints::default(),
        );
        self.engine.control = false;
        res
    }
}
