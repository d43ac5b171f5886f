//! The [`Fabric`]: every rank's host, the hosts' NICs (rails) and leaf
//! switches, built the same on every rank from every rank's
//! [`HostRecord`] and the optional `topology.conf` tree.

use super::host::{HostRecord, Nic};
use super::slurm::SwitchTree;

/// A switch on the path from a leaf to the top.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathSwitch {
    /// `SwitchName`.
    pub name: String,
    /// Its level (0: leaf).
    pub level: usize,
    /// `LinkSpeed`, if given.
    pub link_speed: Option<u64>,
}

/// A leaf switch holding hosts of this communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// The switch's name; for a pseudo-leaf, its host's name.
    pub name: String,
    /// Whether it stands for a host `topology.conf` does not name (or
    /// every host, without a file): nothing is known above it.
    pub pseudo: bool,
    /// The switches from this leaf (first) to the top; empty for a
    /// pseudo-leaf.
    pub path: Vec<PathSwitch>,
}

/// One host of the communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Its name (looked up in `topology.conf`).
    pub name: String,
    /// Its identity.
    pub id: Vec<u8>,
    /// Its NICs, by rail (those of its first rank).
    pub nics: Vec<Nic>,
    /// Index of its leaf in [`Fabric::leaves`].
    pub leaf: usize,
    /// Its ranks, ascending.
    pub ranks: Vec<usize>,
}

/// The communicator's ranks, hosts, rails and leaf switches.
#[derive(Clone, Debug, PartialEq)]
pub struct Fabric {
    hosts: Vec<Host>,
    leaves: Vec<Leaf>,
    /// Per rank: (host index, local rank).
    ranks: Vec<(usize, usize)>,
    rails: usize,
    oversub: Vec<f64>,
}

impl Fabric {
    /// Builds the fabric from every rank's record (index = rank), the
    /// switch tree if there is one, and the oversubscription ratios per
    /// switch level from the leaves up (`NCCL_RS_TOPO_OVERSUB`).
    ///
    /// Ranks with equal, non-empty identities share a host; hosts are
    /// numbered in the order of their first rank. Leaves are the tree's
    /// leaves that hold hosts of this communicator, in the file's order,
    /// then one pseudo-leaf per host the tree does not name (every host,
    /// without a tree), in host order.
    pub fn build(records: &[HostRecord], tree: Option<&SwitchTree>, oversub: &[f64]) -> Fabric {
        let mut hosts: Vec<Host> = Vec::new();
        let mut ranks = Vec::with_capacity(records.len());
        for (r, rec) in records.iter().enumerate() {
            let found = match rec.id.is_empty() {
                true => None,
                false => hosts.iter().position(|h| h.id == rec.id),
            };
            let h = found.unwrap_or_else(|| {
                hosts.push(Host {
                    name: rec.name.clone(),
                    id: rec.id.clone(),
                    nics: rec.nics.clone(),
                    leaf: 0,
                    ranks: Vec::new(),
                });
                hosts.len() - 1
            });
            ranks.push((h, hosts[h].ranks.len()));
            hosts[h].ranks.push(r);
        }
        let switch_of: Vec<Option<usize>> = hosts
            .iter()
            .map(|h| tree.and_then(|t| t.leaf_of(&h.name)))
            .collect();
        let mut used: Vec<usize> = switch_of.iter().flatten().copied().collect();
        used.sort_unstable();
        used.dedup();
        let mut leaves: Vec<Leaf> = Vec::new();
        if let Some(t) = tree {
            for &s in &used {
                let path: Vec<PathSwitch> = t
                    .path_from(s)
                    .into_iter()
                    .map(|i| {
                        let sw = &t.switches()[i];
                        PathSwitch {
                            name: sw.name.clone(),
                            level: sw.level,
                            link_speed: sw.link_speed,
                        }
                    })
                    .collect();
                leaves.push(Leaf {
                    name: t.switches()[s].name.clone(),
                    pseudo: false,
                    path,
                });
            }
        }
        for (h, s) in switch_of.iter().enumerate() {
            hosts[h].leaf = match s {
                Some(s) => used.binary_search(s).expect("a used leaf"),
                None => {
                    leaves.push(Leaf {
                        name: hosts[h].name.clone(),
                        pseudo: true,
                        path: Vec::new(),
                    });
                    leaves.len() - 1
                }
            };
        }
        let rails = hosts.iter().map(|h| h.nics.len()).min().unwrap_or(0);
        Fabric {
            hosts,
            leaves,
            ranks,
            rails,
            oversub: oversub.to_vec(),
        }
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        self.ranks.len()
    }

    /// The number of hosts.
    pub fn nhosts(&self) -> usize {
        self.hosts.len()
    }

    /// The hosts, in the order of their first rank.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host of `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        self.ranks[rank].0
    }

    /// `rank`'s position among its host's ranks.
    pub fn local_rank(&self, rank: usize) -> usize {
        self.ranks[rank].1
    }

    /// The number of ranks on `rank`'s host.
    pub fn local_size(&self, rank: usize) -> usize {
        self.hosts[self.host_of(rank)].ranks.len()
    }

    /// The ranks of `host`, ascending.
    pub fn local_ranks(&self, host: usize) -> &[usize] {
        &self.hosts[host].ranks
    }

    /// Whether ranks `a` and `b` share a host.
    pub fn same_host(&self, a: usize, b: usize) -> bool {
        self.host_of(a) == self.host_of(b)
    }

    /// The number of leaves (named and pseudo).
    pub fn nleaves(&self) -> usize {
        self.leaves.len()
    }

    /// The leaves: the file's, then pseudo-leaves.
    pub fn leaves(&self) -> &[Leaf] {
        &self.leaves
    }

    /// The leaf of `host`.
    pub fn leaf_of_host(&self, host: usize) -> usize {
        self.hosts[host].leaf
    }

    /// The rails every host has: the fewest NICs of any host.
    pub fn rails(&self) -> usize {
        self.rails
    }

    /// The oversubscription ratio of switch `level` (0: leaves), if
    /// `NCCL_RS_TOPO_OVERSUB` gives one.
    pub fn oversubscription(&self, level: usize) -> Option<f64> {
        self.oversub.get(level).copied()
    }

    /// The hosts `topology.conf` does not name (each its own pseudo-leaf),
    /// when a file was given.
    pub fn unplaced_hosts(&self) -> Vec<&str> {
        let named = self.leaves.iter().any(|l| !l.pseudo);
        let pseudo = self.hosts.iter().filter(|h| self.leaves[h.leaf].pseudo);
        match named {
            true => pseudo.map(|h| h.name.as_str()).collect(),
            false => Vec::new(),
        }
    }

    /// The ranks sorted by (leaf, host, local rank): a ring in this order
    /// crosses each host boundary and each leaf boundary once, whatever
    /// the rank numbering.
    pub fn ring_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.nranks()).collect();
        order.sort_by_key(|&r| {
            let (h, l) = self.ranks[r];
            (self.hosts[h].leaf, h, l)
        });
        order
    }

    /// One line: ranks, hosts, ranks per host, rails, leaves.
    pub fn summary(&self) -> String {
        let per: Vec<usize> = self.hosts.iter().map(|h| h.ranks.len()).collect();
        let (lo, hi) = (
            per.iter().min().copied().unwrap_or(0),
            per.iter().max().copied().unwrap_or(0),
        );
        let per_host = match lo == hi {
            true => format!("{lo}"),
            false => format!("{lo}-{hi}"),
        };
        let pseudo = self.leaves.iter().filter(|l| l.pseudo).count();
        let leaves = match (pseudo, self.leaves.len() - pseudo) {
            (_, 0) => format!(
                "{} (no topology file)",
                plural(self.nleaves(), "leaf", "leaves")
            ),
            (0, _) => plural(self.nleaves(), "leaf", "leaves"),
            (p, _) => format!("{} ({p} unnamed)", plural(self.nleaves(), "leaf", "leaves")),
        };
        format!(
            "Topology: {} on {}, {per_host} per host, {}, {leaves}",
            plural(self.nranks(), "rank", "ranks"),
            plural(self.nhosts(), "host", "hosts"),
            plural(self.rails, "rail", "rails"),
        )
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::IpAddr;

    /// A record for host `name` with `nics` NICs named `eth0`, `eth1`, ...
    pub(crate) fn rec(name: &str, nics: usize) -> HostRecord {
        HostRecord {
            id: format!("boot/{name}").into_bytes(),
            name: name.into(),
            nics: (0..nics)
                .map(|i| Nic {
                    name: format!("eth{i}"),
                    addr: IpAddr::from([10, 78, 0, i as u8 + 1]),
                    speed_mbps: 25000,
                    rail: i as u32,
                })
                .collect(),
        }
    }

    /// The records of ranks placed on hosts `place[r]` (`h0`, `h1`, ...).
    fn placed(place: &[usize]) -> Vec<HostRecord> {
        place.iter().map(|h| rec(&format!("h{h}"), 1)).collect()
    }

    fn tree(text: &str) -> SwitchTree {
        SwitchTree::parse(text).unwrap()
    }

    #[test]
    fn ring_order_follows_hosts_and_leaves() {
        let two_leaves = tree(
            "SwitchName=a Nodes=h[0,2]\nSwitchName=b Nodes=h[1,3]\nSwitchName=s Switches=a,b\n",
        );
        let reversed = tree("SwitchName=b Nodes=h1\nSwitchName=a Nodes=h0\n");
        // (placement of ranks on hosts, tree, ring order)
        let cases: &[(&[usize], Option<&SwitchTree>, &[usize])] = &[
            // Rank order: hosts already contiguous.
            (&[0, 0, 1, 1], None, &[0, 1, 2, 3]),
            // srun's cyclic placement: rank r on host r % 2.
            (&[0, 1, 0, 1], None, &[0, 2, 1, 3]),
            (&[0, 1, 2, 0, 1, 2], None, &[0, 3, 1, 4, 2, 5]),
            // Unequal ranks per host.
            (&[0, 1, 0, 0, 2, 1], None, &[0, 2, 3, 1, 5, 4]),
            // Two leaves, hosts interleaved: h0,h2 under a, h1,h3 under b.
            (&[0, 1, 2, 3], Some(&two_leaves), &[0, 2, 1, 3]),
            (
                &[0, 1, 2, 3, 0, 1, 2, 3],
                Some(&two_leaves),
                &[0, 4, 2, 6, 1, 5, 3, 7],
            ),
            // Leaves in the file's order, not the hosts'.
            (&[0, 1], Some(&reversed), &[1, 0]),
            (&[0], None, &[0]),
        ];
        for (place, t, want) in cases {
            let f = Fabric::build(&placed(place), *t, &[]);
            assert_eq!(f.ring_order(), *want, "{place:?}");
        }
    }

    #[test]
    fn local_ranks_and_hosts() {
        let f = Fabric::build(&placed(&[0, 1, 0, 0, 2, 1]), None, &[]);
        assert_eq!((f.nranks(), f.nhosts(), f.nleaves()), (6, 3, 3));
        let hosts: Vec<usize> = (0..6).map(|r| f.host_of(r)).collect();
        let local: Vec<usize> = (0..6).map(|r| f.local_rank(r)).collect();
        let size: Vec<usize> = (0..6).map(|r| f.local_size(r)).collect();
        assert_eq!(hosts, [0, 1, 0, 0, 2, 1]);
        assert_eq!(local, [0, 0, 1, 2, 0, 1]);
        assert_eq!(size, [3, 2, 3, 3, 1, 2]);
        assert_eq!(f.local_ranks(0), [0, 2, 3]);
        assert_eq!(f.local_ranks(1), [1, 5]);
        assert_eq!(f.local_ranks(2), [4]);
        assert!(f.same_host(0, 3) && !f.same_host(0, 1) && f.same_host(4, 4));
        // Hosts numbered by first rank, whatever their names.
        let g = Fabric::build(&placed(&[5, 2, 5]), None, &[]);
        let names: Vec<&str> = g.hosts().iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["h5", "h2"]);
    }

    #[test]
    fn empty_identities_are_hosts_of_their_own() {
        let mut recs = placed(&[0, 0]);
        recs.iter_mut().for_each(|r| r.id.clear());
        let f = Fabric::build(&recs, None, &[]);
        assert_eq!(f.nhosts(), 2);
        assert!(!f.same_host(0, 1));
    }

    #[test]
    fn leaves_rails_and_oversubscription() {
        let t = tree(
            "SwitchName=unused Nodes=x\nSwitchName=b Nodes=h1\nSwitchName=a Nodes=h0,h2\n\
             SwitchName=s Switches=a,b,unused LinkSpeed=400\n",
        );
        let mut recs = vec![rec("h0", 2), rec("h1", 3), rec("h2", 2), rec("h9", 4)];
        recs.push(recs[0].clone());
        let f = Fabric::build(&recs, Some(&t), &[2.0, 1.5]);
        let leaves: Vec<(&str, bool)> = f
            .leaves()
            .iter()
            .map(|l| (l.name.as_str(), l.pseudo))
            .collect();
        assert_eq!(leaves, [("b", false), ("a", false), ("h9", true)]);
        let of: Vec<usize> = (0..f.nhosts()).map(|h| f.leaf_of_host(h)).collect();
        assert_eq!(of, [1, 0, 1, 2]);
        assert_eq!(f.unplaced_hosts(), ["h9"]);
        assert_eq!(f.rails(), 2);
        let path: Vec<(&str, usize, Option<u64>)> = f.leaves()[0]
            .path
            .iter()
            .map(|s| (s.name.as_str(), s.level, s.link_speed))
            .collect();
        assert_eq!(path, [("b", 0, None), ("s", 1, Some(400))]);
        assert_eq!(
            [
                f.oversubscription(0),
                f.oversubscription(1),
                f.oversubscription(2)
            ],
            [Some(2.0), Some(1.5), None]
        );
        assert_eq!(f.ring_order(), [1, 0, 4, 2, 3]);
        assert_eq!(
            f.summary(),
            "Topology: 5 ranks on 4 hosts, 1-2 per host, 2 rails, 3 leaves (1 unnamed)"
        );
        let g = Fabric::build(&placed(&[0, 0, 1, 1]), None, &[]);
        assert!(g.unplaced_hosts().is_empty());
        assert_eq!(
            g.summary(),
            "Topology: 4 ranks on 2 hosts, 2 per host, 1 rail, 2 leaves (no topology file)"
        );
        let h = Fabric::build(&placed(&[0, 1]), Some(&t), &[]);
        assert_eq!(
            h.summary(),
            "Topology: 2 ranks on 2 hosts, 1 per host, 1 rail, 2 leaves"
        );
    }
}
