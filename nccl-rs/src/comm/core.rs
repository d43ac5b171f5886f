//! The state every operation of a communicator goes through, shared by the
//! caller's thread and the async worker: the engine, the sequence number and
//! the first error.

use super::P2P_TAG;
use crate::datatype::{DataType, RedOp};
use crate::engine::{Call, CallBufs, Engine};
use crate::error::{Error, Result};
use crate::plan::{plan, Coll};
use crate::schedule::Schedule;

pub(crate) struct Core {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) engine: Engine,
    pub(crate) seq: u64,
    pub(crate) failed: Option<String>,
}

impl Core {
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
        let sched = plan(coll, self.nranks, self.rank, dtype, chunk);
        self.seq += 1;
        let what = format!("{} #{}", coll.name(), self.seq);
        self.execute(&sched, dtype, op, (self.seq as u32) & !P2P_TAG, what, bufs)
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
        let call = Call { sched, dtype, op, tag, what };
        let res = self.engine.run(call, bufs);
        if let Err(e) = &res {
            tracing::warn!(rank = self.rank, "{e}");
            self.failed = Some(e.to_string());
        }
        res
    }
}
