//! What the planner knows of a communicator spread over hosts: the ranks of
//! each host and the cost of the links inside and between them. From these
//! it predicts the all-reduce algorithms and picks hierarchical schedules.

use super::{Algo, Coll, LinkClass, Model, TREE_FILL};
use crate::schedule::Hosts;
use crate::topo::Fabric;

/// Ranks grouped by host, with the links' costs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HostLayout {
    /// The ranks of each host in local-rank order, hosts in ring order.
    ranks: Vec<Vec<usize>>,
    /// Between ranks of one host.
    intra: Model,
    /// Between hosts: one host's share of its NICs, across the spine where
    /// the communicator spans leaves.
    inter: Model,
    /// Where the communicator spans leaves: hosts per leaf and the uplinks'
    /// oversubscription, with the hosts' own bandwidth (bytes per second).
    spine: Option<Spine>,
}

/// The leaves' uplinks of a [`HostLayout`] (see its `spine`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Spine {
    per_leaf: f64,
    oversubscription: f64,
    host_beta: f64,
}

impl HostLayout {
    /// The layout of `fabric` when it has several hosts of equal size with
    /// more than one rank each (the hierarchical schedules' shape; one rank
    /// per host leaves nothing to do inside hosts); `intra` the model of
    /// the transport inside a host, `net` of the network.
    pub(crate) fn of(fabric: &Fabric, intra: Model, net: Model) -> Option<HostLayout> {
        let mut hosts: Vec<usize> = Vec::new();
        for r in fabric.ring_order() {
            let h = fabric.host_of(r);
            if hosts.last() != Some(&h) && !hosts.contains(&h) {
                hosts.push(h);
            }
        }
        let ranks: Vec<Vec<usize>> = hosts
            .iter()
            .map(|&h| fabric.local_ranks(h).to_vec())
            .collect();
        let (h, l) = Hosts { ranks: &ranks }.shape()?;
        if h < 2 || l < 2 {
            return None;
        }
        // A host's rails, each at the slower of its NIC's speed and its
        // leaf's `LinkSpeed` (Mbit/s), whichever are known: a link runs at
        // the speed of its slower end (and virtual NICs report any speed).
        let rails = fabric.rails();
        let mbps: u64 = fabric
            .hosts()
            .iter()
            .map(|host| {
                let leaf = fabric.leaves().get(host.leaf);
                let leaf_speed = leaf
                    .and_then(|l| l.path.first())
                    .and_then(|s| s.link_speed)
                    .unwrap_or(0);
                host.nics
                    .iter()
                    .take(rails)
                    .map(|n| match (n.speed_mbps as u64, leaf_speed) {
                        (0, leaf) => leaf,
                        (nic, 0) => nic,
                        (nic, leaf) => nic.min(leaf),
                    })
                    .sum::<u64>()
            })
            .min()
            .unwrap_or(0);
        let mut inter = match mbps {
            0 => net,
            m => Model {
                beta: m as f64 * 1e6 / 8.0,
                ..net
            },
        };
        let mut spine_links = None;
        if fabric.nleaves() > 1 {
            // A leaf's uplink carries what its hosts send across the spine.
            let per_leaf = h.div_ceil(fabric.nleaves()) as f64;
            let over = fabric.oversubscription(0).unwrap_or(1.0);
            spine_links = Some(Spine {
                per_leaf,
                oversubscription: over,
                host_beta: inter.beta,
            });
            let spine = LinkClass::Spine {
                oversubscription: (over / per_leaf).max(1.0),
            };
            inter = Model {
                alpha: inter.alpha + spine.model().alpha / 2.0,
                beta: inter.beta / (over / per_leaf).max(1.0),
            };
        }
        Some(HostLayout {
            ranks,
            intra,
            inter,
            spine: spine_links,
        })
    }

    /// A layout from its parts (tests).
    #[cfg(test)]
    pub(crate) fn new(ranks: Vec<Vec<usize>>, intra: Model, inter: Model) -> HostLayout {
        HostLayout {
            ranks,
            intra,
            inter,
            spine: None,
        }
    }

    /// The same layout spread over leaves of `per_leaf` hosts whose uplinks
    /// are oversubscribed `oversubscription`:1 (tests).
    #[cfg(test)]
    pub(crate) fn with_spine(mut self, per_leaf: f64, oversubscription: f64) -> HostLayout {
        self.spine = Some(Spine {
            per_leaf,
            oversubscription,
            host_beta: self.inter.beta,
        });
        self
    }

    /// The hosts, for the hierarchical schedules.
    pub(crate) fn hosts(&self) -> Hosts<'_> {
        Hosts { ranks: &self.ranks }
    }

    /// The cost of a step between hosts.
    pub(crate) fn inter(&self) -> Model {
        self.inter
    }

    /// Ranks in all.
    pub(crate) fn nranks(&self) -> usize {
        self.ranks.iter().map(Vec::len).sum()
    }

    /// Predicted seconds of an all-reduce of `bytes` by `algo` over these
    /// hosts (halving-doubling and direct: the flat model over the links
    /// between hosts).
    pub(crate) fn predict(&self, algo: Algo, bytes: usize) -> Option<f64> {
        let (h, l) = (self.ranks.len() as f64, self.ranks[0].len() as f64);
        let n = h * l;
        let s = bytes as f64;
        let (a, b) = (self.intra, self.inter);
        Some(match algo {
            // Every step of the ring waits for its hops between hosts; the
            // host's NIC carries its one outgoing ring edge.
            Algo::Ring => 2.0 * (n - 1.0) * b.alpha + 2.0 * (n - 1.0) / n * s / b.beta,
            // Reduce-scatter inside, a ring per local rank between hosts
            // (the host's L flows share its NICs), all-gather inside.
            Algo::Hierarchical => {
                2.0 * (l - 1.0) * a.alpha
                    + 2.0 * (l - 1.0) / l * s / a.beta
                    + 2.0 * (h - 1.0) * b.alpha
                    + 2.0 * (h - 1.0) / h * s / b.beta
            }
            // Chains inside hosts, a double binary tree between them: each
            // host sends and receives the whole buffer once per direction.
            Algo::Tree => {
                let depth = h.log2().ceil().max(1.0);
                2.0 * (depth + TREE_FILL) * b.alpha + 2.0 * (l - 1.0) * a.alpha + 2.0 * s / b.beta
            }
            Algo::Direct | Algo::HalvingDoubling => b.predict(algo, n as usize, bytes),
        })
    }

    /// Predicted seconds of a call that is not an all-reduce, moving
    /// `bytes` (all-gather: its output; reduce-scatter: its input;
    /// all-to-all: one rank's input), hierarchically or not.
    pub(crate) fn predict_other(
        &self,
        coll: Coll,
        hierarchical: bool,
        bytes: usize,
    ) -> Option<f64> {
        let (h, l) = (self.ranks.len() as f64, self.ranks[0].len() as f64);
        let n = h * l;
        let s = bytes as f64;
        let (a, b) = (self.intra, self.inter);
        Some(match (coll, hierarchical) {
            (Coll::AllGather { .. } | Coll::ReduceScatter { .. }, true) => {
                (l - 1.0) * a.alpha
                    + (l - 1.0) / l * s / a.beta
                    + (h - 1.0) * b.alpha
                    + (h - 1.0) / h * s / b.beta
            }
            (Coll::AllGather { .. } | Coll::ReduceScatter { .. }, false) => {
                (n - 1.0) * b.alpha + (n - 1.0) / n * s / b.beta
            }
            (Coll::Broadcast { .. }, true) => {
                (h - 1.0) * b.alpha + (l - 1.0) * a.alpha + s / b.beta
            }
            (Coll::Broadcast { .. }, false) => (n - 1.0) * b.alpha + s / b.beta,
            // Each rank's blocks for other hosts share its host's links; a
            // leaf's uplink carries its hosts' blocks for other leaves.
            (Coll::AllToAll { .. }, _) => {
                let host = l * (n - l) / n * s;
                let time = match self.spine {
                    Some(sp) => {
                        let leaf = sp.per_leaf * l;
                        let up = sp.oversubscription * l * (n - leaf).max(0.0) / n * s;
                        host.max(up) / sp.host_beta
                    }
                    None => host / b.beta,
                };
                (n - 1.0) * b.alpha + time
            }
            _ => return None,
        })
    }
}
