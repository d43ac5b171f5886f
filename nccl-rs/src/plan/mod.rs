//! The planner: picks the algorithm and the chunk size of each call.
//!
//! The tuning model predicts `time = latency + bytes / bandwidth` per
//! algorithm from two constants of the transport — one-way step latency α
//! and link bandwidth β, fitted by `scripts/fit-model.sh` (see [`Model`]) —
//! and picks the cheapest:
//!
//! | algorithm | latency | bytes through each rank, each way |
//! |---|---|---|
//! | ring | `2(n-1)·α` | `2(n-1)/n · S` |
//! | double binary tree | `2·depth·α` (+ pipeline fill) | `2·S` (interior in one tree, leaf in the other) |
//! | direct (low latency) | `α` | `(n-1)·S` |
//! | halving-doubling | `2·log2(p)·α` (+ `2α` fold when `n ≠ p`) | `2(p-1)/p · S` (+ `S` on fold partners), at [`HD_BW`] of the link speed |
//!
//! (`p` is the largest power of two not above `n`.) Halving-doubling pays
//! the ring's bytes in fewer steps, but its steps do not overlap (each halves
//! the data the previous one reduced), so it streams slower than the ring:
//! it wins at middle sizes, between the direct path and the ring.
//!
//! `NCCL_ALGO` overrides the model, globally (`ring`, `tree`,
//! `halvingdoubling` or `hd`, `^tree`) or per collective
//! (`allreduce:tree;broadcast:ring`). `NCCL_PROTO` takes the same forms
//! (module `spec`): without `LL` it disables the direct path, as NCCL's
//! Simple protocol has no low-latency mode; `LL` alone forces it for
//! all-reduce. `LL128` counts as `Simple`.
//!
//! Small all-gathers, reduce-scatters and broadcasts at 3 ranks or more also
//! run in one hop (every rank sends straight to every rank that needs its
//! data) instead of the ring's `n - 1`, below [`DIRECT_ALL_GATHER_MAX_BYTES`],
//! [`DIRECT_REDUCE_SCATTER_MAX_BYTES`] and [`DIRECT_BROADCAST_MAX_BYTES`],
//! unless `NCCL_ALGO` or `NCCL_PROTO` rule the direct path out for them.

use crate::datatype::DataType;
use crate::error::Result;
use crate::schedule::{self, Schedule};
use spec::{Proto, Rules};

pub(crate) mod call;
pub(crate) mod placement;
mod spec;
pub(crate) use call::{
    CallFacts, CallPlan, LinkClass, SchedFacts, Shape, Staging, Stores, Topology,
};
pub(crate) use placement::{Placement, PlacementMode, PlacementSource};
pub(crate) use spec::check;

/// Which collective, with its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

    /// How many kinds of collective there are.
    pub(crate) const KINDS: usize = 8;

    /// One collective of each kind.
    const ALL: [Coll; Coll::KINDS] = [
        Coll::AllReduce { count: 0 },
        Coll::ReduceScatter { recv_count: 0 },
        Coll::AllGather { send_count: 0 },
        Coll::Broadcast { count: 0, root: 0 },
        Coll::Reduce { count: 0, root: 0 },
        Coll::AllToAll { count: 0 },
        Coll::Gather { count: 0, root: 0 },
        Coll::Scatter { count: 0, root: 0 },
    ];

    /// The collective's kind, as an index below [`Coll::KINDS`].
    pub(crate) fn index(&self) -> usize {
        match self {
            Coll::AllReduce { .. } => 0,
            Coll::ReduceScatter { .. } => 1,
            Coll::AllGather { .. } => 2,
            Coll::Broadcast { .. } => 3,
            Coll::Reduce { .. } => 4,
            Coll::AllToAll { .. } => 5,
            Coll::Gather { .. } => 6,
            Coll::Scatter { .. } => 7,
        }
    }

    /// The collective's size in bytes over `nranks` ranks: the whole data
    /// that every rank ends up with or contributes, the same on every rank
    /// (a rooted collective's buffers are not: only the root's are whole).
    pub(crate) fn bytes(&self, nranks: usize, dtype: DataType) -> usize {
        let es = dtype.size();
        let n = nranks.max(1);
        let elems = match *self {
            Coll::AllReduce { count }
            | Coll::Broadcast { count, .. }
            | Coll::Reduce { count, .. } => count,
            Coll::ReduceScatter { recv_count } => recv_count.saturating_mul(n),
            Coll::AllGather { send_count } => send_count.saturating_mul(n),
            Coll::AllToAll { count } | Coll::Gather { count, .. } | Coll::Scatter { count, .. } => {
                count.saturating_mul(n)
            }
        };
        elems.saturating_mul(es)
    }

    /// Whether the collective combines data with a reduction operator.
    pub(crate) fn reduces(&self) -> bool {
        matches!(
            self,
            Coll::AllReduce { .. } | Coll::ReduceScatter { .. } | Coll::Reduce { .. }
        )
    }

    /// The name `NCCL_ALGO`'s per-collective syntax uses.
    fn algo_key(&self) -> &'static str {
        match self {
            Coll::AllReduce { .. } => "allreduce",
            Coll::ReduceScatter { .. } => "reducescatter",
            Coll::AllGather { .. } => "allgather",
            Coll::Broadcast { .. } => "broadcast",
            Coll::Reduce { .. } => "reduce",
            Coll::AllToAll { .. } => "alltoall",
            Coll::Gather { .. } => "gather",
            Coll::Scatter { .. } => "scatter",
        }
    }
}

/// All-reduce algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algo {
    /// Pipelined ring.
    Ring,
    /// Double binary tree.
    Tree,
    /// Exchange everything, reduce locally (tiny messages).
    Direct,
    /// Recursive halving-doubling (Rabenseifner; middle sizes).
    HalvingDoubling,
    /// Inside each host, then between hosts, then inside again (several
    /// hosts of equal size; the ring elsewhere).
    Hierarchical,
}

/// The algorithms the planner chooses from when `NCCL_ALGO` is unset (and
/// that `^LIST` excludes from).
const ALGOS: [Algo; 5] = [
    Algo::Ring,
    Algo::Tree,
    Algo::Direct,
    Algo::HalvingDoubling,
    Algo::Hierarchical,
];

impl Algo {
    fn parse(s: &str) -> Option<Algo> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ring" => Some(Algo::Ring),
            "tree" => Some(Algo::Tree),
            "direct" | "ll" => Some(Algo::Direct),
            "halvingdoubling" | "hd" => Some(Algo::HalvingDoubling),
            "hierarchical" | "hier" => Some(Algo::Hierarchical),
            _ => None,
        }
    }
}

/// Wire time, in step latencies, from which an all-to-all message between
/// hosts is acknowledged ([`Planner::acks_pay`]).
const ACK_MIN_ALPHAS: f64 = 100.0;

/// The cost constants of one transport.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Model {
    /// One-way latency of one step, seconds.
    pub(crate) alpha: f64,
    /// Link bandwidth, bytes per second.
    pub(crate) beta: f64,
}

impl Model {
    /// Constants for a transport by name (see [`LinkClass::model`]).
    pub(crate) fn for_transport(name: &str) -> Model {
        LinkClass::of_transport(name).model()
    }

    /// Predicted seconds of an all-reduce of `bytes` over `n` ranks.
    pub(crate) fn predict(&self, algo: Algo, n: usize, bytes: usize) -> f64 {
        let p = schedule::core_size(n) as f64;
        let (n, s) = (n as f64, bytes as f64);
        match algo {
            Algo::Ring | Algo::Hierarchical => {
                2.0 * (n - 1.0) * self.alpha + 2.0 * (n - 1.0) / n * s / self.beta
            }
            Algo::Tree => {
                let depth = n.log2().ceil().max(1.0);
                2.0 * (depth + TREE_FILL) * self.alpha + 2.0 * s / self.beta
            }
            Algo::Direct => self.alpha + (n - 1.0) * s / self.beta,
            Algo::HalvingDoubling => {
                // Fold partners also take in and send back a whole buffer.
                let (fold_steps, fold_bytes) = if p < n { (2.0, s) } else { (0.0, 0.0) };
                let bytes = 2.0 * (p - 1.0) / p * s + fold_bytes;
                (2.0 * p.log2() + fold_steps) * self.alpha + bytes / (HD_BW * self.beta)
            }
        }
    }
}

/// Extra latency steps the tree's pipeline needs to fill (its LAG).
const TREE_FILL: f64 = 2.0;

/// The fraction of the link bandwidth halving-doubling is modelled to
/// stream at, relative to the ring. Its exchanges run one after another,
/// each draining its pipeline before the next starts, while the ring streams
/// all its steps as one wavefront. A conservative guess that leaves large
/// messages to the ring (a 2-core VM could not tell the two apart; measure
/// on real hardware with `scripts/paired.sh`).
pub(crate) const HD_BW: f64 = 0.8;

/// Largest message the direct path is ever chosen for by the model.
const DIRECT_MAX_BYTES: usize = 64 << 10;

/// Largest all-gather (output bytes) and reduce-scatter (input bytes) that
/// run as one exchange (every rank sends straight to every other) instead
/// of the ring's `n - 1` hops, at 3 ranks or more (at 2 the two are the
/// same). One exchange beats the ring's `n - 1` hops while the per-rank
/// sends stay small; above this the ring's single forward per step wins
/// (fitted on a 2-core VM; refit on real hardware with `scripts/paired.sh`).
const DIRECT_ALL_GATHER_MAX_BYTES: usize = 16 << 10;
const DIRECT_REDUCE_SCATTER_MAX_BYTES: usize = 8 << 10;
/// Largest broadcast that the root sends straight to every rank instead of
/// down the ring's chain: it saves the hops while the message is tiny;
/// above this the root's `n - 1` copies outweigh them (fitted likewise).
const DIRECT_BROADCAST_MAX_BYTES: usize = 512;

/// Per-communicator planning state: the model and the user's overrides.
#[derive(Clone, Debug)]
pub(crate) struct Planner {
    model: Model,
    /// Allowed algorithms per collective, from `NCCL_ALGO`.
    algos: Rules<Algo>,
    /// Allowed protocols per collective, from `NCCL_PROTO`.
    protos: Rules<Proto>,
    /// Whether the direct path is allowed, per collective (by
    /// [`Coll::index`]): asked on every call, so worked out once.
    direct: [bool; Coll::KINDS],
    /// The order of the ring schedules (see [`Planner::with_ring`]).
    ring: Option<schedule::RingOrder>,
    /// The hosts, where the communicator spans several (see
    /// [`Planner::with_hosts`]).
    hosts: Option<HostLayout>,
    /// The number of ranks of a communicator whose ranks are on several
    /// hosts (see [`Planner::across_hosts`]).
    across: Option<usize>,
}

impl Planner {
    pub(crate) fn new(transport: &str, algo: Option<&str>, proto: Option<&str>) -> Result<Planner> {
        let mut p = Planner {
            model: Model::for_transport(transport),
            algos: algo.map(spec::algo_rules).transpose()?.unwrap_or_default(),
            protos: proto
                .map(spec::proto_rules)
                .transpose()?
                .unwrap_or_default(),
            direct: [false; Coll::KINDS],
            ring: None,
            hosts: None,
            across: None,
        };
        for coll in Coll::ALL {
            p.direct[coll.index()] = p.allowed(coll).contains(&Algo::Direct);
        }
        Ok(p)
    }

    /// Rings run through `ring` instead of rank order: the same on every
    /// rank (a topology-aware order crosses hosts and switches the fewest
    /// times). Ignored for any other number of ranks.
    pub(crate) fn with_ring(mut self, ring: schedule::RingOrder) -> Planner {
        self.ring = (!ring.is_identity()).then_some(ring);
        self
    }

    /// Calls over all the ranks of `hosts` may run hierarchical schedules
    /// and are costed with its links.
    pub(crate) fn with_hosts(mut self, hosts: HostLayout) -> Planner {
        self.hosts = Some(hosts);
        self
    }

    /// The `nranks` ranks are on several hosts (of any sizes): all-to-all
    /// then goes one peer at a time ([`schedule::all_to_all_paced`]).
    pub(crate) fn across_hosts(mut self, nranks: usize) -> Planner {
        self.across = Some(nranks);
        self
    }

    /// Whether an all-to-all across hosts whose messages are `bytes` long
    /// acknowledges each one ([`schedule::all_to_all_acked`]): when a
    /// message takes at least [`ACK_MIN_ALPHAS`] step latencies on the wire
    /// between hosts. The acknowledgement costs a step latency; it pays
    /// once a message outlasts the start of a TCP flow by far, as then an
    /// unacknowledged one still drains when the next starts.
    pub(crate) fn acks_pay(&self, n: usize, bytes: usize) -> bool {
        let m = self.hosts(n).map_or(self.model, HostLayout::inter);
        bytes as f64 / m.beta >= ACK_MIN_ALPHAS * m.alpha
    }

    /// The hosts, for a call over `n` ranks.
    fn hosts(&self, n: usize) -> Option<&HostLayout> {
        self.hosts.as_ref().filter(|h| h.nranks() == n)
    }

    /// Whether `coll` over `n` ranks runs hierarchically: several hosts and
    /// `NCCL_ALGO` allows it (not all-reduce: [`Planner::all_reduce_algo`]
    /// costs it).
    fn hierarchical(&self, coll: Coll, n: usize) -> bool {
        self.hosts(n).is_some() && self.allowed(coll).contains(&Algo::Hierarchical)
    }

    /// The ring over `n` ranks.
    fn ring(&self, n: usize) -> std::borrow::Cow<'_, schedule::RingOrder> {
        match &self.ring {
            Some(ring) if ring.len() == n => std::borrow::Cow::Borrowed(ring),
            _ => std::borrow::Cow::Owned(schedule::RingOrder::identity(n)),
        }
    }

    fn allowed(&self, coll: Coll) -> Vec<Algo> {
        let key = coll.algo_key();
        let mut algos = spec::rule_for(&self.algos, key).unwrap_or(&ALGOS).to_vec();
        let protos = spec::rule_for(&self.protos, key).unwrap_or(&spec::PROTOS);
        // LL is the direct path; Simple (and LL128, which counts as it) the others.
        let ll = protos.contains(&Proto::Ll);
        let pipelined = protos.contains(&Proto::Simple) || protos.contains(&Proto::Ll128);
        if !ll {
            algos.retain(|a| *a != Algo::Direct);
        }
        if !pipelined && algos.contains(&Algo::Direct) {
            algos = vec![Algo::Direct];
        }
        if algos.is_empty() {
            algos.push(Algo::Ring);
        }
        algos
    }

    /// The all-reduce algorithm for `bytes` over `n` ranks.
    pub(crate) fn all_reduce_algo(&self, n: usize, bytes: usize) -> Algo {
        let allowed = self.allowed(Coll::AllReduce { count: 0 });
        let hosts = self.hosts(n);
        // Across hosts the tree and halving-doubling run only when
        // `NCCL_ALGO` leaves nothing else: on the emulated fabric they took
        // 7-40x their models' time from 1 MiB up (docs/simulation.md), so
        // their predictions cannot be trusted there.
        let rings = allowed.contains(&Algo::Ring) || allowed.contains(&Algo::Hierarchical);
        let untrusted =
            |a: &Algo| hosts.is_some() && rings && matches!(a, Algo::Tree | Algo::HalvingDoubling);
        let cost = |a: &Algo| {
            let big = *a == Algo::Direct && bytes > DIRECT_MAX_BYTES && allowed.len() > 1;
            match (
                big || untrusted(a),
                hosts.and_then(|h| h.predict(*a, bytes)),
            ) {
                (true, _) => f64::INFINITY,
                (false, Some(t)) => t,
                // Without hosts the hierarchical schedule is the ring.
                (false, None) if *a == Algo::Hierarchical => f64::INFINITY,
                (false, None) => self.model.predict(*a, n, bytes),
            }
        };
        allowed
            .iter()
            .copied()
            .min_by(|a, b| cost(a).total_cmp(&cost(b)))
            .unwrap_or(Algo::Ring)
    }

    /// Whether `NCCL_ALGO` and `NCCL_PROTO` allow `coll` the direct path.
    pub(crate) fn allows_direct(&self, coll: Coll) -> bool {
        self.direct[coll.index()]
    }

    /// Whether an all-gather or reduce-scatter moving `bytes` (output of an
    /// all-gather, input of a reduce-scatter) over `n` ranks runs as one
    /// exchange ([`DIRECT_ALL_GATHER_MAX_BYTES`]); `NCCL_ALGO` naming other
    /// algorithms for it, or `NCCL_PROTO` without `LL`, keep the ring.
    fn direct_exchange(&self, coll: Coll, n: usize, bytes: usize) -> bool {
        let max = match coll {
            Coll::AllGather { .. } => DIRECT_ALL_GATHER_MAX_BYTES,
            Coll::ReduceScatter { .. } => DIRECT_REDUCE_SCATTER_MAX_BYTES,
            Coll::Broadcast { .. } => DIRECT_BROADCAST_MAX_BYTES,
            _ => 0,
        };
        n >= 3 && bytes <= max && self.allows_direct(coll)
    }

    /// Predicted seconds of `coll` over `n` ranks (`bytes`: its size as
    /// [`Coll::bytes`] counts it), by the model the planner chose with;
    /// `None` where the planner does not model it.
    pub(crate) fn predict(&self, coll: Coll, n: usize, bytes: usize) -> Option<f64> {
        let hosts = self.hosts(n);
        match coll {
            Coll::AllReduce { .. } => {
                let algo = self.all_reduce_algo(n, bytes);
                hosts
                    .and_then(|h| h.predict(algo, bytes))
                    .or_else(|| Some(self.model.predict(algo, n, bytes)))
            }
            Coll::AllGather { .. }
            | Coll::ReduceScatter { .. }
            | Coll::Broadcast { .. }
            | Coll::AllToAll { .. } => {
                hosts.and_then(|h| h.predict_other(coll, self.hierarchical(coll, n), bytes))
            }
            _ => None,
        }
    }

    /// The hierarchical schedule `build` makes, when `coll` runs so.
    fn hier(
        &self,
        coll: Coll,
        n: usize,
        build: impl FnOnce(schedule::Hosts<'_>) -> Option<Schedule>,
    ) -> Option<Schedule> {
        match self.hierarchical(coll, n) {
            true => self.hosts(n).and_then(|h| build(h.hosts())),
            false => None,
        }
    }

    /// Builds the schedule of `coll` for `rank` of `nranks`; `chunk` is the
    /// staging slot size in elements.
    pub(crate) fn plan(
        &self,
        coll: Coll,
        nranks: usize,
        rank: usize,
        dtype: DataType,
        chunk: usize,
    ) -> Schedule {
        let (n, r) = (nranks, rank);
        let ring = self.ring(n);
        match coll {
            Coll::AllReduce { count } => match self.all_reduce_algo(n, count * dtype.size()) {
                Algo::Ring => schedule::all_reduce_on(&ring, r, count, chunk),
                Algo::Tree => self
                    .hosts(n)
                    .and_then(|h| schedule::all_reduce_tree_hier(h.hosts(), r, count, chunk))
                    .unwrap_or_else(|| schedule::all_reduce_tree(n, r, count, chunk)),
                Algo::Hierarchical => self
                    .hosts(n)
                    .and_then(|h| schedule::all_reduce_hier(h.hosts(), r, count, chunk))
                    .unwrap_or_else(|| schedule::all_reduce_on(&ring, r, count, chunk)),
                Algo::Direct => schedule::all_reduce_direct(n, r, count),
                Algo::HalvingDoubling => schedule::all_reduce_halving_doubling(n, r, count, chunk),
            },
            Coll::ReduceScatter { recv_count } => {
                if self.direct_exchange(coll, n, n * recv_count * dtype.size()) {
                    schedule::reduce_scatter_direct(n, r, recv_count)
                } else if let Some(s) = self.hier(coll, n, |h| {
                    schedule::reduce_scatter_hier(h, r, recv_count, chunk)
                }) {
                    s
                } else {
                    schedule::reduce_scatter_on(&ring, r, recv_count, chunk)
                }
            }
            Coll::AllGather { send_count } => {
                if self.direct_exchange(coll, n, n * send_count * dtype.size()) {
                    schedule::all_gather_direct(n, r, send_count)
                } else if let Some(s) = self.hier(coll, n, |h| {
                    schedule::all_gather_hier(h, r, send_count, chunk)
                }) {
                    s
                } else {
                    schedule::all_gather_on(&ring, r, send_count, chunk)
                }
            }
            Coll::Broadcast { count, root } => {
                if self.direct_exchange(coll, n, count * dtype.size()) {
                    schedule::broadcast_direct(n, r, root, count)
                } else if let Some(s) = self.hier(coll, n, |h| {
                    schedule::broadcast_hier(h, r, root, count, chunk)
                }) {
                    s
                } else {
                    schedule::broadcast_on(&ring, r, root, count, chunk)
                }
            }
            Coll::Reduce { count, root } => schedule::reduce_on(&ring, r, root, count, chunk),
            Coll::AllToAll { count } if self.across == Some(n) => {
                match self.acks_pay(n, count.min(chunk) * dtype.size()) {
                    true => schedule::all_to_all_acked(n, r, count, chunk),
                    false => schedule::all_to_all_paced(n, r, count, chunk),
                }
            }
            Coll::AllToAll { count } => schedule::all_to_all(n, r, count, chunk),
            Coll::Gather { count, root } => schedule::gather(n, r, root, count),
            Coll::Scatter { count, root } => schedule::scatter(n, r, root, count),
        }
    }
}

mod choice;
pub(crate) use choice::Choice;
mod fabric;
pub(crate) use fabric::HostLayout;

#[cfg(test)]
mod tests;
