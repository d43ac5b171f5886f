//! Fabrics: generators for the shapes vendors build (two- and three-tier
//! leaf-spine with a radix and an oversubscription, rail-optimized, fat
//! tree) and Slurm's `topology.conf`.
//!
//! Every fabric also carries what a communicator on it would learn (a
//! `topology.conf` tree and the oversubscription per level), so the
//! planner chooses as it would there.

use crate::net::Net;
use nccl_rs::topo::SwitchTree;

/// Where a host's NICs are cabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rails {
    /// All NICs of a host on its one leaf.
    Shared,
    /// Rail-optimized: NIC k of every host of a block on leaf k of the
    /// block; every leaf reaches every spine.
    Optimized,
    /// Rail planes: as `Optimized`, but rail k's leaves reach only rail
    /// k's spines (each rail its own network, as the emulated fabric).
    Planes,
}

/// A fabric: the network and the facts the library learns about it.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Switches, links, hosts.
    pub net: Net,
    /// Host names, in host order.
    pub hosts: Vec<String>,
    /// NICs per host.
    pub rails: usize,
    /// Each NIC's speed, Mbit/s (what the kernel would report).
    pub nic_mbps: u64,
    /// The Slurm tree a job on it is given (`NCCL_RS_TOPO_FILE`).
    pub topology_conf: String,
    /// Uplink oversubscription per level (`NCCL_RS_TOPO_OVERSUB`).
    pub oversub: Vec<f64>,
    /// One line saying what it is.
    pub summary: String,
}

/// A two- or three-tier leaf-spine fabric.
#[derive(Clone, Debug, PartialEq)]
pub struct LeafSpine {
    /// Hosts.
    pub hosts: usize,
    /// NICs per host.
    pub rails: usize,
    /// NIC speed, Gbit/s.
    pub nic_gbps: f64,
    /// Hosts per leaf (per rail with rail-optimized leaves).
    pub hosts_per_leaf: usize,
    /// Spines (tier 2) each leaf connects to; 0: as many as the leaf has
    /// NIC ports divided by the oversubscription (a radix split).
    pub spines: usize,
    /// Leaf uplink oversubscription: down capacity / up capacity.
    pub oversub: f64,
    /// How NICs are cabled.
    pub rails_layout: Rails,
    /// Leaves per pod for a three-tier fabric (0: two tiers).
    pub leaves_per_pod: usize,
    /// Core switches (three tiers), each reached by every pod switch.
    pub cores: usize,
    /// Pod-to-core oversubscription (three tiers).
    pub oversub2: f64,
    /// Latency of every cable, seconds.
    pub link_latency: f64,
}

impl Default for LeafSpine {
    fn default() -> LeafSpine {
        LeafSpine {
            hosts: 4,
            rails: 1,
            nic_gbps: 400.0,
            hosts_per_leaf: 2,
            spines: 0,
            oversub: 1.0,
            rails_layout: Rails::Shared,
            leaves_per_pod: 0,
            cores: 0,
            oversub2: 1.0,
            link_latency: 0.5e-6,
        }
    }
}

/// Bytes per second of `gbps`.
pub fn gbps(gbps: f64) -> f64 {
    gbps * 1e9 / 8.0
}

fn ranges(prefix: &str, n: usize) -> String {
    match n {
        1 => format!("{prefix}0"),
        _ => format!("{prefix}[0-{}]", n - 1),
    }
}

impl LeafSpine {
    /// Builds the fabric; an error names a parameter that cannot work.
    pub fn build(&self) -> Result<Cluster, String> {
        let p = self;
        if p.hosts == 0 || p.rails == 0 || p.hosts_per_leaf == 0 {
            return Err("hosts, rails and hosts per leaf must be at least 1".into());
        }
        if !(p.oversub >= 1.0 && p.oversub2 >= 1.0 && p.nic_gbps > 0.0) {
            return Err("oversubscription must be >= 1 and the NIC speed > 0".into());
        }
        let rate = gbps(p.nic_gbps);
        let lat = p.link_latency;
        let blocks = p.hosts.div_ceil(p.hosts_per_leaf);
        let per_rail = p.rails_layout != Rails::Shared;
        // NIC ports per leaf and their capacity.
        let nic_ports = p.hosts_per_leaf * if per_rail { 1 } else { p.rails };
        let down = nic_ports as f64 * rate;
        let spines = match p.spines {
            0 => ((nic_ports as f64 / p.oversub).round() as usize).max(1),
            s => s,
        };
        let mut net = Net::new();
        let groups = if per_rail { p.rails } else { 1 };
        // leaf[g][b]: the leaf of block b for rail group g.
        let leaf: Vec<Vec<usize>> = (0..groups)
            .map(|g| {
                (0..blocks)
                    .map(|b| net.add_switch(format!("leaf{}", g * blocks + b)))
                    .collect()
            })
            .collect();
        let nleaves = groups * blocks;
        let up_each = down / p.oversub / spines as f64;
        if nleaves > 1 {
            if p.leaves_per_pod == 0 {
                // Two tiers: spine planes per rail group, or one shared layer.
                let planes = if p.rails_layout == Rails::Planes {
                    groups
                } else {
                    1
                };
                for plane in 0..planes {
                    let sp: Vec<usize> = (0..spines)
                        .map(|s| net.add_switch(format!("spine{}", plane * spines + s)))
                        .collect();
                    let gs: Vec<usize> = match planes {
                        1 => (0..groups).collect(),
                        _ => vec![plane],
                    };
                    for g in gs {
                        for &l in &leaf[g] {
                            for &s in &sp {
                                net.connect(l, s, up_each, up_each, lat);
                            }
                        }
                    }
                }
            } else {
                // Three tiers: pods of leaves under pod switches, cores above.
                let lpp = p.leaves_per_pod;
                let all: Vec<usize> = leaf.iter().flatten().copied().collect();
                let pods = all.len().div_ceil(lpp);
                let cores: Vec<usize> = (0..p.cores.max(1))
                    .map(|c| net.add_switch(format!("core{c}")))
                    .collect();
                for pod in 0..pods {
                    let members = &all[pod * lpp..((pod + 1) * lpp).min(all.len())];
                    let aggs: Vec<usize> = (0..spines)
                        .map(|s| net.add_switch(format!("pod{pod}.agg{s}")))
                        .collect();
                    for &l in members {
                        for &a in &aggs {
                            net.connect(l, a, up_each, up_each, lat);
                        }
                    }
                    let agg_down = members.len() as f64 * up_each;
                    let core_each = agg_down / p.oversub2 / cores.len() as f64;
                    for &a in &aggs {
                        for &c in &cores {
                            net.connect(a, c, core_each, core_each, lat);
                        }
                    }
                }
            }
        }
        let mut hosts = Vec::with_capacity(p.hosts);
        for h in 0..p.hosts {
            let name = format!("h{h}");
            let b = h / p.hosts_per_leaf;
            let sw: Vec<usize> = (0..p.rails)
                .map(|k| if per_rail { leaf[k][b] } else { leaf[0][b] })
                .collect();
            net.add_host(&name, &sw, rate, lat);
            hosts.push(name);
        }
        // What Slurm knows: hosts under their block's leaf, one top switch
        // (a rail-optimized host sits on several leaves; the tree holds
        // its block).
        let mut conf = String::new();
        for b in 0..blocks {
            let (lo, hi) = (
                b * p.hosts_per_leaf,
                ((b + 1) * p.hosts_per_leaf).min(p.hosts) - 1,
            );
            let nodes = if lo == hi {
                format!("h{lo}")
            } else {
                format!("h[{lo}-{hi}]")
            };
            conf += &format!("SwitchName=leaf{b} Nodes={nodes}\n");
        }
        if blocks > 1 {
            conf += &format!("SwitchName=top Switches={}\n", ranges("leaf", blocks));
        }
        let layout = match p.rails_layout {
            Rails::Shared => "",
            Rails::Optimized => ", rail-optimized",
            Rails::Planes => ", rail planes",
        };
        let tiers = if p.leaves_per_pod > 0 {
            "three-tier"
        } else {
            "two-tier"
        };
        let summary = format!(
            "{tiers} leaf-spine{layout}: {} hosts x {} NICs at {} Gbit/s, {} hosts per leaf, {} leaves, {} spines per leaf, {}:1",
            p.hosts, p.rails, p.nic_gbps, p.hosts_per_leaf, nleaves, spines, p.oversub
        );
        Ok(Cluster {
            net,
            hosts,
            rails: p.rails,
            nic_mbps: (p.nic_gbps * 1000.0) as u64,
            topology_conf: conf,
            oversub: vec![p.oversub],
            summary,
        })
    }
}

/// A k-ary fat tree (k even): k pods of k/2 edge and k/2 aggregation
/// switches, (k/2)² cores, k³/4 hosts with one NIC each, every link at
/// `nic_gbps`. Aggregation switch i of every pod reaches cores
/// i·k/2 .. (i+1)·k/2 - 1. Non-blocking.
pub fn fat_tree(k: usize, nic_gbps: f64, link_latency: f64) -> Result<Cluster, String> {
    if k < 2 || k % 2 != 0 {
        return Err(format!("a fat tree needs an even k >= 2, not {k}"));
    }
    let half = k / 2;
    let rate = gbps(nic_gbps);
    let mut net = Net::new();
    let cores: Vec<usize> = (0..half * half)
        .map(|c| net.add_switch(format!("core{c}")))
        .collect();
    let mut edges = Vec::new();
    for pod in 0..k {
        let aggs: Vec<usize> = (0..half)
            .map(|a| net.add_switch(format!("pod{pod}.agg{a}")))
            .collect();
        for e in 0..half {
            let edge = net.add_switch(format!("leaf{}", pod * half + e));
            for &a in &aggs {
                net.connect(edge, a, rate, rate, link_latency);
            }
            edges.push(edge);
        }
        for (i, &a) in aggs.iter().enumerate() {
            for c in 0..half {
                net.connect(a, cores[i * half + c], rate, rate, link_latency);
            }
        }
    }
    let mut hosts = Vec::new();
    for (e, &edge) in edges.iter().enumerate() {
        for j in 0..half {
            let name = format!("h{}", e * half + j);
            net.add_host(&name, &[edge], rate, link_latency);
            hosts.push(name);
        }
    }
    let mut conf = String::new();
    for e in 0..edges.len() {
        let lo = e * half;
        conf += &format!("SwitchName=leaf{e} Nodes=h[{lo}-{}]\n", lo + half - 1);
    }
    for pod in 0..k {
        conf += &format!(
            "SwitchName=pod{pod} Switches=leaf[{}-{}]\n",
            pod * half,
            pod * half + half - 1
        );
    }
    conf += &format!("SwitchName=top Switches={}\n", ranges("pod", k));
    Ok(Cluster {
        net,
        summary: format!(
            "fat tree k={k}: {} hosts at {nic_gbps} Gbit/s, {} edge, {} aggregation, {} core switches",
            hosts.len(),
            k * half,
            k * half,
            half * half
        ),
        hosts,
        rails: 1,
        nic_mbps: (nic_gbps * 1000.0) as u64,
        topology_conf: conf,
        oversub: vec![1.0, 1.0],
    })
}

/// The fabric of a Slurm `topology.conf`: every node it names is a host
/// (the first `hosts` in the file's order if given) with `rails` NICs on
/// its leaf at `nic_gbps` (capped by the leaf's `LinkSpeed`, Mbit/s); a
/// switch's uplink carries its down capacity divided by `oversub` of its
/// level (the last value for higher levels, 1 without any).
pub fn from_topology_conf(
    text: &str,
    hosts: Option<usize>,
    rails: usize,
    nic_gbps: f64,
    oversub: &[f64],
    link_latency: f64,
) -> Result<Cluster, String> {
    let tree = SwitchTree::parse(text).map_err(|e| format!("topology.conf: {e}"))?;
    let sw = tree.switches();
    let mut net = Net::new();
    let ids: Vec<usize> = sw.iter().map(|s| net.add_switch(s.name.clone())).collect();
    let mut names = Vec::new();
    let mut host_leaf = Vec::new();
    for (i, s) in sw.iter().enumerate() {
        for n in &s.nodes {
            if hosts.is_some_and(|h| names.len() >= h) {
                break;
            }
            if !names.contains(n) {
                names.push(n.clone());
                host_leaf.push(i);
            }
        }
    }
    if let Some(h) = hosts {
        if names.len() < h {
            return Err(format!(
                "topology.conf names {} nodes, not {h}",
                names.len()
            ));
        }
    }
    if names.is_empty() {
        return Err("topology.conf names no nodes".into());
    }
    let nic = |leaf: usize| {
        let r = gbps(nic_gbps);
        match sw[leaf].link_speed {
            Some(m) if m > 0 => r.min(m as f64 * 1e6 / 8.0),
            _ => r,
        }
    };
    // Down capacity below each switch, leaves up.
    let mut below = vec![0.0; sw.len()];
    for &l in &host_leaf {
        below[l] += rails as f64 * nic(l);
    }
    let mut order: Vec<usize> = (0..sw.len()).collect();
    order.sort_by_key(|&i| sw[i].level);
    for &i in &order {
        if let Some(parent) = sw[i].parent {
            let o = oversub
                .get(sw[i].level)
                .or(oversub.last())
                .copied()
                .unwrap_or(1.0)
                .max(1.0);
            let up = below[i] / o;
            if up > 0.0 {
                net.connect(ids[i], ids[parent], up, up, link_latency);
            }
            below[parent] += up;
        }
    }
    for (name, &l) in names.iter().zip(&host_leaf) {
        net.add_host(name, &vec![ids[l]; rails], nic(l), link_latency);
    }
    Ok(Cluster {
        summary: format!(
            "topology.conf: {} hosts x {rails} NICs at {nic_gbps} Gbit/s, {} switches",
            names.len(),
            sw.len()
        ),
        net,
        hosts: names,
        rails,
        nic_mbps: (nic_gbps * 1000.0) as u64,
        topology_conf: text.to_string(),
        oversub: oversub.to_vec(),
    })
}
