//! The network: switches, directed links with a capacity and a latency,
//! hosts with one NIC per rail, and the paths between NICs (shortest paths,
//! ECMP among the equal-cost next hops).

use std::collections::HashMap;

/// One direction of a cable (or of a host's memory path).
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    /// A readable name (`h3.nic1>leaf2`, `leaf2>spine0`, ...).
    pub name: String,
    /// Bytes per second.
    pub capacity: f64,
    /// Seconds from entering to leaving the link.
    pub latency: f64,
}

/// A host's NIC on one rail: its switch and the two directions of its cable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Port {
    /// The switch the NIC is cabled to.
    pub switch: usize,
    /// NIC to switch.
    pub up: usize,
    /// Switch to NIC.
    pub down: usize,
}

/// How a flow picks among equal-cost next hops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ecmp {
    /// A hash of the flow's endpoints and the switch, with a seed: flows
    /// collide on uplinks as on real fabrics.
    Hash {
        /// Mixed into every hash.
        seed: u64,
    },
    /// Each flow takes the next hop that the fewest flows took so far: an
    /// even spread (adaptive routing's ideal).
    Spread,
}

/// Switches, links and hosts.
#[derive(Clone, Debug, Default)]
pub struct Net {
    /// Every link; a flow's path is a list of indices into it.
    pub links: Vec<Link>,
    /// Switch names.
    pub switches: Vec<String>,
    /// Per switch: (neighbour switch, link to it).
    adj: Vec<Vec<(usize, usize)>>,
    /// Per host, per rail: its NIC's port.
    pub ports: Vec<Vec<Port>>,
    /// Per host, per local rank: (out, in) links of shared memory.
    pub mem: Vec<Vec<(usize, usize)>>,
    /// Per destination switch: hops from every switch (`u32::MAX`:
    /// unreachable), filled on demand.
    dist: HashMap<usize, Vec<u32>>,
    /// Flows that took each link so far ([`Ecmp::Spread`]).
    taken: Vec<u32>,
}

impl Net {
    /// A network without switches or hosts.
    pub fn new() -> Net {
        Net::default()
    }

    /// Adds a switch; returns its index.
    pub fn add_switch(&mut self, name: String) -> usize {
        self.switches.push(name);
        self.adj.push(Vec::new());
        self.switches.len() - 1
    }

    fn add_link(&mut self, name: String, capacity: f64, latency: f64) -> usize {
        self.links.push(Link {
            name,
            capacity,
            latency,
        });
        self.taken.push(0);
        self.links.len() - 1
    }

    /// Cables switches `a` and `b`: `up` bytes/s from `a` to `b`, `down`
    /// back; returns the two links.
    pub fn connect(
        &mut self,
        a: usize,
        b: usize,
        up: f64,
        down: f64,
        latency: f64,
    ) -> (usize, usize) {
        let (na, nb) = (self.switches[a].clone(), self.switches[b].clone());
        let ab = self.add_link(format!("{na}>{nb}"), up, latency);
        let ba = self.add_link(format!("{nb}>{na}"), down, latency);
        self.adj[a].push((b, ab));
        self.adj[b].push((a, ba));
        (ab, ba)
    }

    /// Adds a host with one NIC per entry of `switches` (rail order), each
    /// at `rate` bytes/s both ways; returns the host's index.
    pub fn add_host(&mut self, name: &str, switches: &[usize], rate: f64, latency: f64) -> usize {
        let h = self.ports.len();
        let mut ports = Vec::with_capacity(switches.len());
        for (k, &s) in switches.iter().enumerate() {
            let sw = self.switches[s].clone();
            let up = self.add_link(format!("{name}.nic{k}>{sw}"), rate, latency);
            let down = self.add_link(format!("{sw}>{name}.nic{k}"), rate, latency);
            ports.push(Port {
                switch: s,
                up,
                down,
            });
        }
        self.ports.push(ports);
        self.mem.push(Vec::new());
        h
    }

    /// Gives host `h` shared-memory links for `local` ranks, each way at
    /// `rate` bytes/s.
    pub fn add_memory(&mut self, h: usize, local: usize, rate: f64, latency: f64) {
        for l in 0..local {
            let out = self.add_link(format!("h{h}.mem{l}.out"), rate, latency);
            let inn = self.add_link(format!("h{h}.mem{l}.in"), rate, latency);
            self.mem[h].push((out, inn));
        }
    }

    /// Hosts.
    pub fn nhosts(&self) -> usize {
        self.ports.len()
    }

    /// Rails of host `h`.
    pub fn rails(&self, h: usize) -> usize {
        self.ports[h].len()
    }

    fn dist_to(&mut self, dst: usize) -> &Vec<u32> {
        let (adj, n) = (&self.adj, self.switches.len());
        self.dist.entry(dst).or_insert_with(|| {
            // Links are cabled in pairs, so hops to `dst` are hops from it.
            let mut d = vec![u32::MAX; n];
            let mut queue = std::collections::VecDeque::from([dst]);
            d[dst] = 0;
            while let Some(u) = queue.pop_front() {
                for &(v, _) in &adj[u] {
                    if d[v] == u32::MAX {
                        d[v] = d[u] + 1;
                        queue.push_back(v);
                    }
                }
            }
            d
        })
    }

    /// The links from NIC `(src, rail_a)` to NIC `(dst, rail_b)`; `key`
    /// identifies the flow for hashing. `None` if no path exists.
    pub fn path(
        &mut self,
        (src, rail_a): (usize, usize),
        (dst, rail_b): (usize, usize),
        key: u64,
        ecmp: Ecmp,
    ) -> Option<Vec<usize>> {
        let (a, b) = (self.ports[src][rail_a], self.ports[dst][rail_b]);
        let mut path = vec![a.up];
        let d = self.dist_to(b.switch).clone();
        let mut u = a.switch;
        if d[u] == u32::MAX {
            return None;
        }
        while u != b.switch {
            let next: Vec<(usize, usize)> = self.adj[u]
                .iter()
                .copied()
                .filter(|&(v, _)| d[v] != u32::MAX && d[v] + 1 == d[u])
                .collect();
            let (v, l) = match ecmp {
                _ if next.len() == 1 => next[0],
                Ecmp::Hash { seed } => {
                    let h = mix(key ^ mix(seed ^ (u as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
                    next[(h % next.len() as u64) as usize]
                }
                Ecmp::Spread => *next
                    .iter()
                    .min_by_key(|&&(_, l)| self.taken[l])
                    .expect("a next hop"),
            };
            self.taken[l] += 1;
            path.push(l);
            u = v;
        }
        path.push(b.down);
        Some(path)
    }
}

/// SplitMix64's finaliser: a well-mixed 64-bit hash of `x`.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
