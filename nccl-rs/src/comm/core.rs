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
use crate::engine::{Call, CallBufs, Engine};
use crate::error::{Error, Result};
use crate::plan::{Coll, Planner};
use crate::schedule::Schedule;
use crate::transport::NetError;
use std::collections::VecDeque;
use std::time::Duration;

/// How many operation descriptions are kept for mismatch reports.
const HISTORY: usize = 64;

pub(crate) struct Core {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) engine: Engine,
    pub(crate) boot: Bootstrap,
    pub(crate) seq: u64,
    pub(crate) failed: Option<String>,
    history: VecDeque<(u64, String)>,
    planner: Planner,
}

/// FNV-1a over the description and sequence number, folded to 31 bits.
fn fingerprint(seq: u64, desc: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in seq.to_le_bytes().iter().chain(desc.as_bytes()) {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h & !P2P_TAG
}

fn describe(coll: Coll, dtype: DataType, op: RedOp) -> String {
    let reduces = matches!(coll, Coll::AllReduce { .. } | Coll::ReduceScatter { .. } | Coll::Reduce { .. });
    let op = if reduces { format!(", {op}") } else { String::new() };
    match coll {
        Coll::AllReduce { count } | Coll::AllToAll { count } => format!("{}(count={count}, {dtype}{op})", coll.name()),
        Coll::ReduceScatter { recv_count: count } | Coll::AllGather { send_count: count } => {
            format!("{}(count={count}, {dtype}{op})", coll.name())
        }
        Coll::Broadcast { count, root }
        | Coll::Reduce { count, root }
        | Coll::Gather { count, root }
        | Coll::Scatter { count, root } => format!("{}(count={count}, {dtype}{op}, root={root})", coll.name()),
    }
}

impl Core {
    pub(crate) fn new(rank: usize, nranks: usize, engine: Engine, boot: Bootstrap, planner: Planner) -> Core {
        Core { rank, nranks, engine, boot, seq: 0, failed: None, history: VecDeque::with_capacity(HISTORY), planner }
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        match &self.failed {
            Some(first) => Err(Error::Poisoned { rank: self.rank, first: first.clone() }),
            None => Ok(()),
        }
    }

    /// Plans and runs one collective on raw buffers: the one path of every
    /// collective, blocking or async.
    pub(crate) fn collective(&mut self, coll: Coll, dtype: DataType, op: RedOp, bufs: CallBufs) -> Result<()> {
        self.check_usable()?;
        let chunk = self.engine.chunk_elems(dtype.size());
        let sched = self.planner.plan(coll, self.nranks, self.rank, dtype, chunk);
        self.seq += 1;
        let desc = describe(coll, dtype, op);
        let tag = fingerprint(self.seq, &desc);
        let what = format!("{desc} as operation #{}", self.seq);
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((self.seq, desc));
        self.execute(&sched, dtype, op, tag, what, bufs)
    }

    pub(crate) fn execute(
        &mut self,
        sched: &Schedule,
        dtype: DataType,
        op: RedOp,
        tag: u32,
        what: String,
        bufs: CallBufs,
    ) -> Result<()> {
        self.check_usable()?;
        let Core { rank, engine, boot, history, seq, .. } = self;
        let (rank, seq) = (*rank, *seq);
        let describe = |s: u64| {
            history.iter().find(|(k, _)| *k == s).map(|(_, d)| d.clone()).unwrap_or_else(|| {
                format!("no operation #{s} (its last was #{seq})")
            })
        };
        let to_error = |ev: Event| match ev {
            Event::RemoteFailure(msg) => Error::Remote { rank, msg },
            Event::Mismatch(msg) => Error::InvalidUsage(format!("rank {rank}: {msg}")),
        };
        let call = Call { sched, dtype, op, tag, what };
        let mut health = || boot.check(&describe).map(to_error);
        let mut res = engine.run(call, bufs, &mut health);
        if let Err(e) = &res {
            let mismatch = matches!(
                e,
                Error::Transport {
                    source: NetError::TagMismatch { .. } | NetError::Truncated { .. } | NetError::Protocol(_),
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
