//! The library's schedules on a simulated fabric.
//!
//! # Model
//! Every rank runs the schedule nccl-rs builds for it (`FabricPlanner`,
//! the same value the engine executes). The steps are grouped into
//! *levels* by their dependencies: a step that receives a message runs one
//! level after the step that sent it, and no earlier than the rank's
//! previous step; a send belongs to the level of its step. All messages of
//! a level start together; several messages between one pair of ranks in
//! a level form one flow (they share a connection). Flows share links
//! max-min fairly, and the rates are worked out again whenever a flow ends.
//! A level lasts until its last flow has arrived: its transfer, the
//! latencies of its path's links and the per-message overhead `alpha`.
//! The call's time is the sum of its levels. Local copies and reductions
//! cost nothing.
//!
//! A message between hosts crosses the NICs of both (one subflow per rail
//! with [`RailUse::Stripe`], as nccl-rs's TCP transport stripes a
//! connection over the rails; the local rank's rail with
//! [`RailUse::Affinity`]); inside a host it crosses the sender's and the
//! receiver's shared-memory links.
//!
//! # Shortcuts
//! - **Patterns repeat.** A level's flows are summed up as a pattern (the
//!   list of `(sender, receiver, bytes)`); the network's answer for a
//!   pattern is computed once and reused for every level with the same
//!   pattern (the ring's `2(n-1)` steps are one pattern).
//! - **Symmetric schedules.** Ring and hierarchical schedules are the same
//!   on every rank up to relabelling the ranks (a rotation of the ring, or
//!   of the hosts and of the local ranks). For these only rank 0's schedule
//!   is expanded; every other rank's level `i` sends are the image of rank
//!   0's. This is checked against the real schedules of sampled ranks
//!   before it is used (peers equal, counts within one element); the
//!   counts are rank 0's, so the result is exact when the buffer splits
//!   into equal parts and otherwise off by at most one element per
//!   message. Elsewhere every rank's schedule is expanded.

use crate::gen::Cluster;
use crate::maxmin::{self, Flow};
use crate::net::{mix, Ecmp};
use nccl_rs::planning::{Collective, FabricPlanner};
use nccl_rs::schedule::{Schedule, Step};
use nccl_rs::topo::{Fabric, HostRecord, Nic, SwitchTree};
use nccl_rs::DataType;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

/// How ranks are numbered over the hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Host h holds ranks h·L .. h·L + L - 1 (srun's block, `--map-by slot`).
    Block,
    /// Rank r on host r mod H (srun's cyclic, `--map-by node`).
    Cyclic,
}

/// Which hosts of the fabric a job gets, in job host order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostOrder {
    /// The fabric's first hosts, in order (whole leaves).
    Packed,
    /// One host from each leaf in turn (a scheduler that scattered the
    /// job): consecutive job hosts sit on different leaves.
    Spread,
}

/// Which rails a message between hosts uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RailUse {
    /// Striped over every rail, rail k to rail k (nccl-rs over TCP).
    Stripe,
    /// The sender's local rank's rail (mod rails) at both ends (one NIC
    /// per GPU, `NCCL_CROSS_NIC=0`).
    Affinity,
}

/// Cost constants outside the links.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// Per-message overhead of every level with a message, seconds.
    pub alpha: f64,
    /// Fraction of a link's rate that carries payload (headers, framing).
    pub goodput: f64,
    /// Shared-memory rate of each rank, each way, bytes/s.
    pub intra_rate: f64,
    /// Shared-memory latency, seconds.
    pub intra_latency: f64,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs {
            alpha: 5e-6,
            goodput: 1.0,
            intra_rate: 100e9,
            intra_latency: 1e-6,
        }
    }
}

/// A job on a fabric: its ranks placed on the hosts.
#[derive(Clone, Debug)]
pub struct Job {
    /// The fabric, with the hosts' shared-memory links.
    pub cluster: Cluster,
    /// Per rank: (host, local rank).
    pub place: Vec<(usize, usize)>,
    /// What a communicator over it would build.
    pub fabric: Fabric,
    /// Ranks per host.
    pub local: usize,
}

impl Job {
    /// `local` ranks on each of the first `hosts` hosts of `cluster`.
    pub fn new(
        cluster: Cluster,
        hosts: usize,
        local: usize,
        placement: Placement,
        costs: &Costs,
    ) -> Result<Job, String> {
        Job::with_order(cluster, hosts, local, placement, HostOrder::Packed, costs)
    }

    /// As [`Job::new`], taking the hosts in `order`.
    pub fn with_order(
        mut cluster: Cluster,
        hosts: usize,
        local: usize,
        placement: Placement,
        order: HostOrder,
        costs: &Costs,
    ) -> Result<Job, String> {
        if hosts == 0 || local == 0 || hosts > cluster.net.nhosts() {
            return Err(format!(
                "{hosts} hosts x {local} ranks do not fit a fabric of {} hosts",
                cluster.net.nhosts()
            ));
        }
        let n = hosts * local;
        let pick = match order {
            HostOrder::Packed => (0..hosts).collect(),
            HostOrder::Spread => spread(&cluster, hosts),
        };
        let place: Vec<(usize, usize)> = (0..n)
            .map(|r| match placement {
                Placement::Block => (pick[r / local], r % local),
                Placement::Cyclic => (pick[r % hosts], r / hosts),
            })
            .collect();
        for &h in &pick {
            cluster
                .net
                .add_memory(h, local, costs.intra_rate, costs.intra_latency);
        }
        let records: Vec<HostRecord> = place.iter().map(|&(h, _)| record(&cluster, h)).collect();
        let tree = SwitchTree::parse(&cluster.topology_conf)
            .map_err(|e| format!("the fabric's topology.conf: {e}"))?;
        let fabric = Fabric::build(&records, Some(&tree), &cluster.oversub);
        Ok(Job {
            cluster,
            place,
            fabric,
            local,
        })
    }

    /// Ranks.
    pub fn nranks(&self) -> usize {
        self.place.len()
    }
}

/// `hosts` hosts of `c`, one leaf after the other: the hosts grouped by the
/// switch of their first NIC, taken round-robin over the groups.
fn spread(c: &Cluster, hosts: usize) -> Vec<usize> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (h, ports) in c.net.ports.iter().enumerate() {
        let s = ports.first().map_or(usize::MAX, |p| p.switch);
        match groups.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push(h),
            None => groups.push((s, vec![h])),
        }
    }
    let mut out = Vec::with_capacity(hosts);
    let mut i = 0;
    while out.len() < hosts {
        for g in &groups {
            if let Some(&h) = g.1.get(i) {
                if out.len() < hosts {
                    out.push(h);
                }
            }
        }
        i += 1;
    }
    out
}

/// The record a rank on host `h` would detect.
fn record(c: &Cluster, h: usize) -> HostRecord {
    let name = c.hosts[h].clone();
    HostRecord {
        id: name.clone().into_bytes(),
        nics: (0..c.rails)
            .map(|k| Nic {
                name: format!("rail{k}"),
                addr: IpAddr::V4(Ipv4Addr::new(10, 90 + k as u8, (h >> 8) as u8, h as u8)),
                speed_mbps: c.nic_mbps.min(u32::MAX as u64) as u32,
                rail: k as u32,
            })
            .collect(),
        name,
    }
}

/// How to run the call.
#[derive(Clone, Debug, PartialEq)]
pub struct Setup {
    /// `NCCL_ALGO` (None: the planner's choice).
    pub algo: Option<String>,
    /// `NCCL_PROTO`.
    pub proto: Option<String>,
    /// Rings in topology order (`NCCL_RS_RING_ORDER` unset) or rank order.
    pub ring_by_topology: bool,
    /// The transport between hosts, for the planner's cost model.
    pub net_transport: String,
    /// Path choice.
    pub ecmp: Ecmp,
    /// Rails.
    pub rails: RailUse,
    /// Costs.
    pub costs: Costs,
    /// The pipelining chunk in bytes (None: the library's default slot).
    pub chunk_bytes: Option<usize>,
    /// Whether the symmetric shortcut may be used.
    pub symmetric: bool,
    /// Largest number of steps expanded over all ranks without the
    /// symmetric shortcut.
    pub max_steps: usize,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            algo: None,
            proto: None,
            ring_by_topology: true,
            net_transport: "Socket".into(),
            ecmp: Ecmp::Hash { seed: 1 },
            rails: RailUse::Stripe,
            costs: Costs::default(),
            chunk_bytes: None,
            symmetric: true,
            max_steps: 60_000_000,
        }
    }
}

/// A link that limited the call.
#[derive(Clone, Debug, PartialEq)]
pub struct Hot {
    /// Its name.
    pub link: String,
    /// Bytes it carried / (its capacity × the call's time).
    pub utilisation: f64,
    /// Bytes it carried.
    pub bytes: f64,
}

/// The simulated call.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The algorithm the planner built (INFO's name).
    pub algorithm: String,
    /// Seconds.
    pub time: f64,
    /// nccl-tests' size of the call, bytes.
    pub bytes: usize,
    /// bytes / time.
    pub algbw: f64,
    /// algbw × nccl-tests' bus factor.
    pub busbw: f64,
    /// Levels (dependency steps).
    pub levels: usize,
    /// Distinct patterns the network model solved.
    pub patterns: usize,
    /// `symmetric` or `full` expansion.
    pub mode: &'static str,
    /// The most utilised links, busiest first.
    pub hot: Vec<Hot>,
    /// The planner's own α/β prediction, seconds.
    pub planner: Option<f64>,
}

/// nccl-tests' bus bandwidth factor of a collective over `n` ranks.
pub fn bus_factor(coll: Collective, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        Collective::AllReduce { .. } => 2.0 * (n - 1.0) / n,
        Collective::AllGather { .. }
        | Collective::ReduceScatter { .. }
        | Collective::AllToAll { .. } => (n - 1.0) / n,
        Collective::Broadcast { .. } | Collective::Reduce { .. } => 1.0,
    }
}

/// The element type every call uses (sizes are in bytes of it).
pub const DTYPE: DataType = DataType::Float32;

/// The collective named `name` (nccl-tests' names: `allreduce`,
/// `allgather`, `reducescatter` or `reduce_scatter`, `broadcast`, `reduce`,
/// `alltoall`) of `bytes` over `n` ranks (nccl-tests' size meaning).
pub fn collective(name: &str, bytes: usize, n: usize) -> Result<Collective, String> {
    let e = DTYPE.size();
    let per = |total: usize| (total / e / n.max(1)).max(1);
    Ok(
        match name.to_ascii_lowercase().replace(['_', '-'], "").as_str() {
            "allreduce" => Collective::AllReduce {
                count: (bytes / e).max(1),
            },
            "allgather" => Collective::AllGather {
                send_count: per(bytes),
            },
            "reducescatter" => Collective::ReduceScatter {
                recv_count: per(bytes),
            },
            "broadcast" => Collective::Broadcast {
                count: (bytes / e).max(1),
                root: 0,
            },
            "reduce" => Collective::Reduce {
                count: (bytes / e).max(1),
                root: 0,
            },
            "alltoall" => Collective::AllToAll { count: per(bytes) },
            _ => return Err(format!("unknown collective {name:?}")),
        },
    )
}

/// One message: (sender, receiver, bytes).
type Msg = (usize, usize, u64);

/// A solved pattern: duration, bytes per link, levels that had it.
type Solved = (f64, Vec<(usize, f64)>, u64);

/// How ranks' schedules map onto rank 0's.
enum Symmetry {
    /// Rotations of a ring: `pos[r]`, `order[p]`.
    Ring { order: Vec<usize>, pos: Vec<usize> },
    /// Rotations of the hosts and of the local ranks.
    Hosts {
        ranks: Vec<Vec<usize>>,
        at: Vec<(usize, usize)>,
    },
}

impl Symmetry {
    /// The rank that `q` in rank 0's schedule stands for in rank `r`'s.
    fn image(&self, r: usize, q: usize) -> usize {
        match self {
            Symmetry::Ring { order, pos } => {
                let n = order.len();
                order[(pos[q] + n - pos[0] + pos[r]) % n]
            }
            Symmetry::Hosts { ranks, at } => {
                let (nh, nl) = (ranks.len(), ranks[0].len());
                let ((h0, l0), (h, l), (hq, lq)) = (at[0], at[r], at[q]);
                ranks[(hq + nh - h0 + h) % nh][(lq + nl - l0 + l) % nl]
            }
        }
    }

    /// The `x` with `image(r, x) == y`.
    fn preimage(&self, r: usize, y: usize) -> usize {
        match self {
            Symmetry::Ring { order, pos } => {
                let n = order.len();
                order[(pos[y] + n - pos[r] + pos[0]) % n]
            }
            Symmetry::Hosts { ranks, at } => {
                let (nh, nl) = (ranks.len(), ranks[0].len());
                let ((h0, l0), (h, l), (hy, ly)) = (at[0], at[r], at[y]);
                ranks[(hy + nh - h + h0) % nh][(ly + nl - l + l0) % nl]
            }
        }
    }
}

fn peers(s: &Step) -> (Option<usize>, Option<usize>) {
    (s.recv_peer(), s.send_peer())
}

/// Whether `real` is rank `r`'s image of rank 0's `base`.
fn is_image(sym: &Symmetry, r: usize, base: &Schedule, real: &Schedule) -> bool {
    base.steps.len() == real.steps.len()
        && base.steps.iter().zip(&real.steps).all(|(b, s)| {
            let (br, bs) = peers(b);
            let (sr, ss) = peers(s);
            std::mem::discriminant(b) == std::mem::discriminant(s)
                && br.map(|q| sym.image(r, q)) == sr
                && bs.map(|q| sym.image(r, q)) == ss
                && b.count().abs_diff(s.count()) <= 1
        })
}

/// Per level: rank 0's messages, from its schedule alone, under `sym`.
fn levels_symmetric(sym: &Symmetry, base: &Schedule, elem: u64) -> Option<Vec<Vec<Msg>>> {
    let mut sent: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut got: HashMap<usize, usize> = HashMap::new();
    let mut levels: Vec<Vec<Msg>> = Vec::new();
    let mut cur = 0;
    for s in &base.steps {
        if let Some(q) = s.recv_peer() {
            // q's sends to rank 0 are rank 0's sends to the preimage of 0 in q's frame.
            let x = sym.preimage(q, 0);
            let m = got.entry(q).or_insert(0);
            let l = *sent.get(&x)?.get(*m)?;
            *m += 1;
            cur = cur.max(l + 1);
        }
        if let Some(to) = s.send_peer() {
            sent.entry(to).or_default().push(cur);
            if levels.len() <= cur {
                levels.resize(cur + 1, Vec::new());
            }
            levels[cur].push((0, to, s.count() as u64 * elem));
        }
    }
    Some(levels)
}

/// Per level: every rank's messages, from every rank's schedule.
fn levels_full(scheds: &[Schedule], elem: u64) -> Result<Vec<Vec<Msg>>, String> {
    let n = scheds.len();
    let mut cursor = vec![0usize; n];
    let mut cur = vec![0usize; n];
    let mut queue: HashMap<(usize, usize), std::collections::VecDeque<usize>> = HashMap::new();
    let mut waiting: HashMap<(usize, usize), usize> = HashMap::new();
    let mut levels: Vec<Vec<Msg>> = Vec::new();
    let mut ready: Vec<usize> = (0..n).rev().collect();
    while let Some(r) = ready.pop() {
        while let Some(s) = scheds[r].steps.get(cursor[r]) {
            if let Some(q) = s.recv_peer() {
                match queue.get_mut(&(q, r)).and_then(|d| d.pop_front()) {
                    Some(l) => cur[r] = cur[r].max(l + 1),
                    None => {
                        waiting.insert((q, r), r);
                        break;
                    }
                }
            }
            if let Some(to) = s.send_peer() {
                queue.entry((r, to)).or_default().push_back(cur[r]);
                if let Some(w) = waiting.remove(&(r, to)) {
                    ready.push(w);
                }
                if levels.len() <= cur[r] {
                    levels.resize(cur[r] + 1, Vec::new());
                }
                levels[cur[r]].push((r, to, s.count() as u64 * elem));
            }
            cursor[r] += 1;
        }
    }
    if let Some(r) = (0..n).find(|&r| cursor[r] < scheds[r].steps.len()) {
        return Err(format!(
            "the schedules do not match: rank {r} waits at step {} of {}",
            cursor[r],
            scheds[r].steps.len()
        ));
    }
    Ok(levels)
}

/// Merges the messages of one pair in a level into one flow; sorted.
fn merge(mut msgs: Vec<Msg>) -> Vec<Msg> {
    msgs.sort_unstable();
    let mut out: Vec<Msg> = Vec::with_capacity(msgs.len());
    for (a, b, c) in msgs {
        match out.last_mut() {
            Some(last) if last.0 == a && last.1 == b => last.2 += c,
            _ => out.push((a, b, c)),
        }
    }
    out
}

/// The network side: paths of connections, capacities, link bytes.
struct Wire<'j> {
    job: &'j mut Job,
    setup: &'j Setup,
    paths: HashMap<(usize, usize, usize), std::rc::Rc<Vec<usize>>>,
    capacity: Vec<f64>,
}

impl Wire<'_> {
    /// The flows of one message.
    fn flows(&mut self, (a, b, bytes): Msg, out: &mut Vec<Flow>) -> Result<(), String> {
        let ((ha, la), (hb, lb)) = (self.job.place[a], self.job.place[b]);
        let net = &self.job.cluster.net;
        if ha == hb {
            out.push(Flow {
                bytes: bytes as f64,
                path: vec![net.mem[ha][la].0, net.mem[hb][lb].1],
            });
            return Ok(());
        }
        let rails = net.rails(ha).min(net.rails(hb));
        let (which, share): (Vec<usize>, f64) = match self.setup.rails {
            RailUse::Stripe => ((0..rails).collect(), bytes as f64 / rails as f64),
            RailUse::Affinity => (vec![la % rails], bytes as f64),
        };
        for k in which {
            let path = match self.paths.get(&(a, b, k)) {
                Some(p) => p.clone(),
                None => {
                    let key = mix(((a as u64) << 40) ^ ((b as u64) << 12) ^ k as u64);
                    let p = self
                        .job
                        .cluster
                        .net
                        .path((ha, k), (hb, k), key, self.setup.ecmp)
                        .ok_or_else(|| {
                            format!("no path from host {ha} to host {hb} on rail {k}")
                        })?;
                    let p = std::rc::Rc::new(p);
                    self.paths.insert((a, b, k), p.clone());
                    p
                }
            };
            out.push(Flow {
                bytes: share,
                path: (*path).clone(),
            });
        }
        Ok(())
    }

    /// A pattern's duration and the bytes it puts on each link.
    fn solve(&mut self, msgs: &[Msg]) -> Result<(f64, Vec<(usize, f64)>), String> {
        let mut flows = Vec::with_capacity(msgs.len());
        for &m in msgs {
            self.flows(m, &mut flows)?;
        }
        if flows.is_empty() {
            return Ok((0.0, Vec::new()));
        }
        let done = maxmin::completion(&self.capacity, &flows);
        let links = &self.job.cluster.net.links;
        let mut t: f64 = 0.0;
        let mut bytes: HashMap<usize, f64> = HashMap::new();
        for (f, d) in flows.iter().zip(done) {
            let lat: f64 = f.path.iter().map(|&l| links[l].latency).sum();
            t = t.max(d + lat);
            for &l in &f.path {
                *bytes.entry(l).or_insert(0.0) += f.bytes;
            }
        }
        Ok((t + self.setup.costs.alpha, bytes.into_iter().collect()))
    }
}

/// Simulates `coll` on `job` as `setup` says.
pub fn simulate(job: &mut Job, coll: Collective, setup: &Setup) -> Result<Outcome, String> {
    let n = job.nranks();
    let mut planner = FabricPlanner::new(
        &job.fabric,
        &setup.net_transport,
        "SHM",
        setup.algo.as_deref(),
        setup.proto.as_deref(),
        setup.ring_by_topology,
    )
    .map_err(|e| e.to_string())?;
    if let Some(c) = setup.chunk_bytes {
        planner = planner.with_chunk_bytes(c);
    }
    let algorithm = planner.algorithm(coll, DTYPE).to_string();
    let elem = DTYPE.size() as u64;
    let sym = match algorithm.as_str() {
        "Ring" => {
            let order = planner.ring_order();
            let mut pos = vec![0; n];
            for (i, &r) in order.iter().enumerate() {
                pos[r] = i;
            }
            Some(Symmetry::Ring { order, pos })
        }
        "Hierarchical" => planner.host_ranks().map(|ranks| {
            let mut at = vec![(0, 0); n];
            for (h, v) in ranks.iter().enumerate() {
                for (l, &r) in v.iter().enumerate() {
                    at[r] = (h, l);
                }
            }
            Symmetry::Hosts { ranks, at }
        }),
        _ => None,
    };
    // Per level: rank 0's messages (symmetric) or every rank's (full).
    let mut levels: Option<Vec<Vec<Msg>>> = None;
    let mut mode = "full";
    let rooted = matches!(
        coll,
        Collective::Broadcast { .. } | Collective::Reduce { .. }
    );
    if let (true, Some(sym), false) = (setup.symmetric, &sym, rooted) {
        let base = planner.schedule(coll, DTYPE, 0);
        let samples = 12.min(n - 1);
        let ok = (1..=samples)
            .map(|i| (i * (n - 1)).div_ceil(samples))
            .all(|r| is_image(sym, r, &base, &planner.schedule(coll, DTYPE, r)));
        if ok {
            if let Some(l) = levels_symmetric(sym, &base, elem) {
                levels = Some(l.into_iter().map(merge).collect());
                mode = "symmetric";
            }
        }
    }
    let levels: Vec<Vec<Msg>> = match levels {
        Some(l) => l,
        None => {
            let steps_est = planner
                .schedule(coll, DTYPE, 0)
                .steps
                .len()
                .saturating_mul(n);
            if steps_est > setup.max_steps {
                return Err(format!(
                    "{algorithm} over {n} ranks is about {steps_est} steps: too many to expand every rank (no symmetric shortcut applies)"
                ));
            }
            let scheds: Vec<Schedule> = (0..n).map(|r| planner.schedule(coll, DTYPE, r)).collect();
            levels_full(&scheds, elem)?.into_iter().map(merge).collect()
        }
    };
    // A symmetric level's messages: every rank's image of rank 0's.
    let expand = |msgs: &[Msg]| -> Vec<Msg> {
        match (&sym, mode) {
            (Some(sym), "symmetric") => (0..n)
                .flat_map(|r| msgs.iter().map(move |&(_, q, b)| (r, sym.image(r, q), b)))
                .collect(),
            _ => msgs.to_vec(),
        }
    };
    let capacity: Vec<f64> = job
        .cluster
        .net
        .links
        .iter()
        .map(|l| l.capacity * setup.costs.goodput)
        .collect();
    let mut wire = Wire {
        job,
        setup,
        paths: HashMap::new(),
        capacity,
    };
    let mut memo: HashMap<Vec<Msg>, usize> = HashMap::new();
    // Per pattern: its duration, the bytes it puts on each link, its levels.
    let mut solved: Vec<Solved> = Vec::new();
    let mut time = 0.0;
    for msgs in &levels {
        let i = match memo.get(msgs) {
            Some(&i) => i,
            None => {
                let (t, b) = wire.solve(&expand(msgs))?;
                solved.push((t, b, 0));
                memo.insert(msgs.clone(), solved.len() - 1);
                solved.len() - 1
            }
        };
        solved[i].2 += 1;
        time += solved[i].0;
    }
    let mut carried: HashMap<usize, f64> = HashMap::new();
    for (_, b, times) in &solved {
        for &(l, x) in b {
            *carried.entry(l).or_insert(0.0) += x * *times as f64;
        }
    }
    let links = &wire.job.cluster.net.links;
    let mut hot: Vec<Hot> = carried
        .into_iter()
        .map(|(l, b)| Hot {
            link: links[l].name.clone(),
            utilisation: if time > 0.0 {
                b / (wire.capacity[l] * time)
            } else {
                0.0
            },
            bytes: b,
        })
        .collect();
    hot.sort_by(|a, b| {
        b.utilisation
            .total_cmp(&a.utilisation)
            .then(a.link.cmp(&b.link))
    });
    hot.truncate(5);
    let bytes = coll.bytes(n, DTYPE);
    let algbw = if time > 0.0 { bytes as f64 / time } else { 0.0 };
    Ok(Outcome {
        algorithm,
        time,
        bytes,
        algbw,
        busbw: algbw * bus_factor(coll, n),
        levels: levels.len(),
        patterns: solved.len(),
        mode,
        hot,
        planner: planner.predict(coll, DTYPE),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nccl_rs::schedule::{all_reduce, all_reduce_on, RingOrder};

    fn ring(order: Vec<usize>) -> Symmetry {
        let mut pos = vec![0; order.len()];
        for (i, &r) in order.iter().enumerate() {
            pos[r] = i;
        }
        Symmetry::Ring { order, pos }
    }

    #[test]
    fn ring_images_and_preimages_invert() {
        let sym = ring(vec![0, 2, 4, 1, 3, 5]);
        for r in 0..6 {
            for q in 0..6 {
                assert_eq!(sym.preimage(r, sym.image(r, q)), q);
            }
        }
        // Rank 0's next (2) is rank 4's next (1) in rank 4's frame.
        assert_eq!(sym.image(4, 2), 1);
    }

    #[test]
    fn the_check_catches_a_schedule_that_is_not_an_image() {
        let sym = ring((0..8).collect());
        let base = all_reduce(8, 0, 1024, 64);
        assert!(is_image(&sym, 3, &base, &all_reduce(8, 3, 1024, 64)));
        // Rank 3 on another ring is not rank 0's image on this one.
        let other = RingOrder::new(vec![0, 3, 1, 2, 4, 5, 6, 7]).unwrap();
        assert!(!is_image(
            &sym,
            3,
            &base,
            &all_reduce_on(&other, 3, 1024, 64)
        ));
        // Nor is a schedule of another size.
        assert!(!is_image(&sym, 3, &base, &all_reduce(8, 3, 2048, 64)));
    }

    #[test]
    fn symmetric_levels_match_the_full_expansion() {
        let sym = ring((0..5).collect());
        let scheds: Vec<Schedule> = (0..5).map(|r| all_reduce(5, r, 1000, 40)).collect();
        let sym_levels = levels_symmetric(&sym, &scheds[0], 4).unwrap();
        let full = levels_full(&scheds, 4).unwrap();
        assert_eq!(sym_levels.len(), full.len());
        for (s, f) in sym_levels.iter().zip(&full) {
            // Rank 0's share of each level is the same.
            let mine: Vec<Msg> = f.iter().copied().filter(|m| m.0 == 0).collect();
            assert_eq!(merge(s.clone()), merge(mine));
        }
    }

    #[test]
    fn unmatched_schedules_are_an_error() {
        let mut scheds: Vec<Schedule> = (0..3).map(|r| all_reduce(3, r, 30, 10)).collect();
        scheds[2].steps.pop();
        scheds[1].steps.truncate(1);
        assert!(levels_full(&scheds, 4)
            .unwrap_err()
            .contains("do not match"));
    }
}
