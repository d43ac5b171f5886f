//! What INFO says a call runs: the algorithm [`Planner::plan`] picks, and
//! NCCL's word for its protocol.

use super::{Algo, Coll, Planner};
use crate::datatype::DataType;

/// An algorithm and protocol, by name. The protocol is `LL` for the direct
/// path (the one `NCCL_PROTO` gates as LL) and `Simple` for the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Choice {
    pub(crate) algo: &'static str,
    pub(crate) proto: &'static str,
}

impl Choice {
    const fn simple(algo: &'static str) -> Choice {
        Choice {
            algo,
            proto: "Simple",
        }
    }

    /// The one-hop exchange (every rank straight to every rank).
    pub(crate) const DIRECT: Choice = Choice {
        algo: "Direct",
        proto: "LL",
    };
    /// The ring (for broadcast and reduce: the pipelined chain along it).
    pub(crate) const RING: Choice = Choice::simple("Ring");
    /// Every pair of ranks exchanges its blocks (all-to-all).
    pub(crate) const PAIRWISE: Choice = Choice::simple("Pairwise");
    /// Straight sends to or from the root, in one step (gather, scatter).
    pub(crate) const ROOTED: Choice = Choice::simple("Direct");

    fn of(algo: Algo) -> Choice {
        match algo {
            Algo::Ring => Choice::RING,
            Algo::Tree => Choice::simple("Tree"),
            Algo::Direct => Choice::DIRECT,
            Algo::HalvingDoubling => Choice::simple("HalvingDoubling"),
            Algo::Hierarchical => Choice::simple("Hierarchical"),
        }
    }
}

impl Coll {
    /// NCCL's name of the collective, as its logs spell it.
    pub(crate) fn nccl_name(&self) -> &'static str {
        match self {
            Coll::AllReduce { .. } => "AllReduce",
            Coll::ReduceScatter { .. } => "ReduceScatter",
            Coll::AllGather { .. } => "AllGather",
            Coll::Broadcast { .. } => "Broadcast",
            Coll::Reduce { .. } => "Reduce",
            Coll::AllToAll { .. } => "AllToAll",
            Coll::Gather { .. } => "Gather",
            Coll::Scatter { .. } => "Scatter",
        }
    }
}

impl Planner {
    /// The algorithm [`Planner::plan`] builds for `coll` over `nranks`
    /// (the same tests, in the same order; `plan_choice_agrees` checks it).
    pub(crate) fn choice(&self, coll: Coll, nranks: usize, dtype: DataType) -> Choice {
        let n = nranks;
        let direct_or_ring = |bytes| match self.direct_exchange(coll, n, bytes) {
            true => Choice::DIRECT,
            false if self.hierarchical(coll, n) => Choice::of(Algo::Hierarchical),
            false => Choice::RING,
        };
        match coll {
            Coll::AllReduce { count } => Choice::of(self.all_reduce_algo(n, count * dtype.size())),
            Coll::ReduceScatter { recv_count } => direct_or_ring(n * recv_count * dtype.size()),
            Coll::AllGather { send_count } => direct_or_ring(n * send_count * dtype.size()),
            Coll::Broadcast { count, .. } => direct_or_ring(count * dtype.size()),
            Coll::Reduce { .. } => Choice::RING,
            Coll::AllToAll { .. } => Choice::PAIRWISE,
            Coll::Gather { .. } | Coll::Scatter { .. } => Choice::ROOTED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule;

    /// `choice` names the schedule `plan` builds, over sizes and rank
    /// counts that cross every threshold, with and without overrides.
    #[test]
    fn plan_choice_agrees() {
        let f32 = DataType::Float32;
        let chunk = 1024;
        for (algo, proto) in [
            (None, None),
            (Some("tree"), None),
            (None, Some("LL")),
            (Some("hd"), None),
        ] {
            let p = Planner::new("Socket", algo, proto).unwrap();
            for n in [2, 3, 4, 8] {
                let r = 1;
                for count in [1usize, 64, 1 << 10, 1 << 14, 1 << 20] {
                    let colls = [
                        Coll::AllReduce { count },
                        Coll::ReduceScatter { recv_count: count },
                        Coll::AllGather { send_count: count },
                        Coll::Broadcast { count, root: 0 },
                    ];
                    for coll in colls {
                        let c = p.choice(coll, n, f32);
                        let want = match (coll, c.algo) {
                            (Coll::AllReduce { count }, "Ring") => {
                                schedule::all_reduce(n, r, count, chunk)
                            }
                            (Coll::AllReduce { count }, "Tree") => {
                                schedule::all_reduce_tree(n, r, count, chunk)
                            }
                            (Coll::AllReduce { count }, "Direct") => {
                                schedule::all_reduce_direct(n, r, count)
                            }
                            (Coll::AllReduce { count }, "HalvingDoubling") => {
                                schedule::all_reduce_halving_doubling(n, r, count, chunk)
                            }
                            (Coll::ReduceScatter { recv_count }, "Direct") => {
                                schedule::reduce_scatter_direct(n, r, recv_count)
                            }
                            (Coll::ReduceScatter { recv_count }, "Ring") => {
                                schedule::reduce_scatter(n, r, recv_count, chunk)
                            }
                            (Coll::AllGather { send_count }, "Direct") => {
                                schedule::all_gather_direct(n, r, send_count)
                            }
                            (Coll::AllGather { send_count }, "Ring") => {
                                schedule::all_gather(n, r, send_count, chunk)
                            }
                            (Coll::Broadcast { count, root }, "Direct") => {
                                schedule::broadcast_direct(n, r, root, count)
                            }
                            (Coll::Broadcast { count, root }, "Ring") => {
                                schedule::broadcast(n, r, root, count, chunk)
                            }
                            other => panic!("unexpected choice {other:?}"),
                        };
                        assert_eq!(
                            p.plan(coll, n, r, f32, chunk),
                            want,
                            "{coll:?} {c:?} n={n} {algo:?} {proto:?}"
                        );
                    }
                }
            }
        }
    }
}
