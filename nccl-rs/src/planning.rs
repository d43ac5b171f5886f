//! The planner's decisions for a call, outside a communicator: which
//! algorithm a call over a [`Fabric`] runs and the schedule every rank
//! executes for it, exactly as a communicator on that fabric would build
//! them. Tools that run the library's schedules on a model of a network
//! (the `fabric-sim` crate) use this, so they cannot drift from the engine.

use crate::datatype::DataType;
use crate::error::Result;
use crate::plan::{Coll, HostLayout, Model, Planner};
use crate::schedule::{RingOrder, Schedule};
use crate::topo::Fabric;

/// A collective and its size in elements (as the C API counts them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// `count` elements, reduced on every rank.
    AllReduce {
        /// Elements per rank.
        count: usize,
    },
    /// Each rank contributes `send_count` elements; all receive all.
    AllGather {
        /// Elements each rank sends.
        send_count: usize,
    },
    /// Each rank receives `recv_count` reduced elements.
    ReduceScatter {
        /// Elements each rank receives.
        recv_count: usize,
    },
    /// `count` elements from `root` to every rank.
    Broadcast {
        /// Elements.
        count: usize,
        /// The sending rank.
        root: usize,
    },
    /// `count` elements reduced to `root`.
    Reduce {
        /// Elements.
        count: usize,
        /// The receiving rank.
        root: usize,
    },
    /// `count` elements from every rank to every rank.
    AllToAll {
        /// Elements per pair of ranks.
        count: usize,
    },
}

impl Collective {
    fn coll(self) -> Coll {
        match self {
            Collective::AllReduce { count } => Coll::AllReduce { count },
            Collective::AllGather { send_count } => Coll::AllGather { send_count },
            Collective::ReduceScatter { recv_count } => Coll::ReduceScatter { recv_count },
            Collective::Broadcast { count, root } => Coll::Broadcast { count, root },
            Collective::Reduce { count, root } => Coll::Reduce { count, root },
            Collective::AllToAll { count } => Coll::AllToAll { count },
        }
    }

    /// The size nccl-tests prints for the call over `nranks` ranks, bytes.
    pub fn bytes(self, nranks: usize, dtype: DataType) -> usize {
        self.coll().bytes(nranks, dtype)
    }
}

/// The planner of a communicator over a fabric, as `Communicator::init`
/// sets it up (ring order, host layout, transports' cost models).
#[derive(Clone, Debug)]
pub struct FabricPlanner {
    planner: Planner,
    nranks: usize,
    chunk_bytes: usize,
    ring: Vec<usize>,
    hosts: Option<Vec<Vec<usize>>>,
}

impl FabricPlanner {
    /// The planner for the ranks of `fabric`. `net` and `intra` name the
    /// transports between and inside hosts (`"Socket"`, `"IB"`, `"SHM"`:
    /// they select the cost models); `algo` and `proto` are `NCCL_ALGO` and
    /// `NCCL_PROTO`; `ring_by_topology` is `NCCL_RS_RING_ORDER` not `rank`.
    /// The pipelining chunk is the default staging slot
    /// (`NCCL_BUFFSIZE / NCCL_RS_STEPS`).
    pub fn new(
        fabric: &Fabric,
        net: &str,
        intra: &str,
        algo: Option<&str>,
        proto: Option<&str>,
        ring_by_topology: bool,
    ) -> Result<FabricPlanner> {
        let mut planner = Planner::new(net, algo, proto)?;
        let mut ring: Vec<usize> = (0..fabric.nranks()).collect();
        if ring_by_topology {
            if let Some(order) = RingOrder::new(fabric.ring_order()) {
                ring = order.ranks().to_vec();
                planner = planner.with_ring(order);
            }
        }
        let (net_model, intra_model) = (Model::for_transport(net), Model::for_transport(intra));
        let mut host_ranks = None;
        if let Some(hosts) = HostLayout::of(fabric, intra_model, net_model) {
            host_ranks = Some(hosts.hosts().ranks.to_vec());
            planner = planner.with_hosts(hosts);
        }
        if fabric.nhosts() > 1 {
            planner = planner.across_hosts(fabric.nranks());
        }
        Ok(FabricPlanner {
            planner,
            nranks: fabric.nranks(),
            chunk_bytes: crate::Config::default().slot_bytes_for(false),
            ring,
            hosts: host_ranks,
        })
    }

    /// Ranks of the communicator.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The order of the ranks around the rings the planner builds.
    pub fn ring_order(&self) -> Vec<usize> {
        self.ring.clone()
    }

    /// The ranks of each host (local-rank order, hosts in ring order)
    /// that the hierarchical schedules use, where they apply.
    pub fn host_ranks(&self) -> Option<Vec<Vec<usize>>> {
        self.hosts.clone()
    }

    /// The pipelining chunk, bytes (a staging slot).
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Uses `bytes` as the pipelining chunk (`NCCL_BUFFSIZE / steps`).
    pub fn with_chunk_bytes(mut self, bytes: usize) -> FabricPlanner {
        self.chunk_bytes = bytes.max(1);
        self
    }

    /// The algorithm the call runs, as INFO names it (`Ring`,
    /// `Hierarchical`, `Tree`, ...).
    pub fn algorithm(&self, coll: Collective, dtype: DataType) -> &'static str {
        self.planner.choice(coll.coll(), self.nranks, dtype).algo
    }

    /// The planner's own α/β prediction of the call, seconds, where it has
    /// one.
    pub fn predict(&self, coll: Collective, dtype: DataType) -> Option<f64> {
        let c = coll.coll();
        self.planner
            .predict(c, self.nranks, c.bytes(self.nranks, dtype))
    }

    /// The schedule `rank` executes for the call: the value the engine runs.
    pub fn schedule(&self, coll: Collective, dtype: DataType, rank: usize) -> Schedule {
        let chunk = (self.chunk_bytes / dtype.size()).max(1);
        self.planner
            .plan(coll.coll(), self.nranks, rank, dtype, chunk)
    }
}
