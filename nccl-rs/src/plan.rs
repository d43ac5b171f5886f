//! The planner: picks the algorithm and the chunk size of each call.
//!
//! For now every collective runs its ring (or pairwise) schedule with chunks
//! of one staging slot (`NCCL_BUFFSIZE / NCCL_STEPS`). The tuning model of
//! the performance work plugs in here.

use crate::datatype::DataType;
use crate::schedule::{self, Schedule};

/// Which collective, with its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Coll {
    AllReduce { count: usize },
    ReduceScatter { recv_count: usize },
    AllGather { send_count: usize },
    Broadcast { count: usize, root: usize },
    Reduce { count: usize, root: usize },
    AllToAll { count: usize },
    Gather { count: usize, root: usize },
    Scatter { count: usize, root: usize },
}

impl Coll {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Coll::AllReduce { .. } => "all_reduce",
            Coll::ReduceScatter { .. } => "reduce_scatter",
            Coll::AllGather { .. } => "all_gather",
            Coll::Broadcast { .. } => "broadcast",
            Coll::Reduce { .. } => "reduce",
            Coll::AllToAll { .. } => "all_to_all",
            Coll::Gather { .. } => "gather",
            Coll::Scatter { .. } => "scatter",
        }
    }
}

/// Builds the schedule of `coll` for `rank` of `nranks`.
pub(crate) fn plan(coll: Coll, nranks: usize, rank: usize, _dtype: DataType, chunk: usize) -> Schedule {
    let (n, r) = (nranks, rank);
    match coll {
        Coll::AllReduce { count } => schedule::all_reduce(n, r, count, chunk),
        Coll::ReduceScatter { recv_count } => schedule::reduce_scatter(n, r, recv_count, chunk),
        Coll::AllGather { send_count } => schedule::all_gather(n, r, send_count, chunk),
        Coll::Broadcast { count, root } => schedule::broadcast(n, r, root, count, chunk),
        Coll::Reduce { count, root } => schedule::reduce(n, r, root, count, chunk),
        Coll::AllToAll { count } => schedule::all_to_all(n, r, count),
        Coll::Gather { count, root } => schedule::gather(n, r, root, count),
        Coll::Scatter { count, root } => schedule::scatter(n, r, root, count),
    }
}
