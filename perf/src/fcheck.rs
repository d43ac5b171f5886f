//! The pure part of `fabric_check`: which hosts measure each other when
//! ([`rounds`]), which links and hosts are outliers ([`find_outliers`]),
//! and the report (table, JSON). The measuring runner is
//! `src/bin/fabric_check.rs`; the tool is described in `docs/fabric_check.md`.

use nccl_rs::json;
use std::fmt::Write as _;

/// The round-robin tournament over `n` hosts (the circle method): every
/// pair `(a, b)` with `a < b` exactly once, no host twice in one round, so
/// the pairs of a round share no host link. `n - 1` rounds for even `n`,
/// `n` for odd `n` (each host sits one round out). Pairs sorted in a round.
pub fn rounds(n: usize) -> Vec<Vec<(usize, usize)>> {
    if n < 2 {
        return Vec::new();
    }
    // An odd count gets a phantom host `n`: its partner sits out.
    let m = n + n % 2;
    let last = m - 1;
    (0..last)
        .map(|k| {
            let mut round: Vec<(usize, usize)> = Vec::with_capacity(m / 2);
            let mut add = |a: usize, b: usize| {
                if a < n && b < n {
                    round.push((a.min(b), a.max(b)));
                }
            };
            add(last, k);
            for i in 1..m / 2 {
                add((k + i) % last, (k + last - i) % last);
            }
            round.sort_unstable();
            round
        })
        .collect()
}

/// The pairs of `round` in groups of at most `max_pairs` (0: all at once)
/// that run at the same time.
pub fn batches(round: &[(usize, usize)], max_pairs: usize) -> Vec<Vec<(usize, usize)>> {
    let size = if max_pairs == 0 {
        round.len().max(1)
    } else {
        max_pairs
    };
    round.chunks(size).map(<[_]>::to_vec).collect()
}

/// What was measured on one link direction: rail `r`, host `src` to host
/// `dst`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Bandwidth from `src` to `dst`, Gbit/s (10^9 bit/s): its best
    /// pass's burst.
    pub gbps: f64,
    /// Half the 10th percentile of the round trips of a small message
    /// between the two, µs (the same both ways), the lowest of the passes:
    /// the path's latency, not the scheduler's hiccups; loss shows in
    /// `retrans`.
    pub lat_us: f64,
    /// TCP segments `src`'s host retransmitted while sending, all passes
    /// (0 off TCP).
    pub retrans: u64,
    /// TCP segments `src`'s host sent meanwhile.
    pub segs: u64,
}

impl Sample {
    /// Retransmitted share of the segments sent (0 when none were counted).
    pub fn loss(&self) -> f64 {
        if self.segs == 0 {
            0.0
        } else {
            self.retrans as f64 / self.segs as f64
        }
    }
}

/// Every link direction's [`Sample`] on every rail.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// Host names, by host index.
    pub hosts: Vec<String>,
    /// Rails measured.
    pub rails: usize,
    /// Per rail, host name of each host's NIC on it (`nics[r][h]`).
    pub nics: Vec<Vec<String>>,
    /// `cells[(r * H + src) * H + dst]`; `src == dst` unused.
    pub cells: Vec<Sample>,
}

impl Matrix {
    /// An empty matrix (every sample zero).
    pub fn new(hosts: Vec<String>, rails: usize, nics: Vec<Vec<String>>) -> Matrix {
        let h = hosts.len();
        Matrix {
            hosts,
            rails,
            nics,
            cells: vec![Sample::default(); rails * h * h],
        }
    }

    /// Index of rail `r`, `src` to `dst` in [`Matrix::cells`].
    pub fn index(&self, r: usize, src: usize, dst: usize) -> usize {
        let h = self.hosts.len();
        (r * h + src) * h + dst
    }

    /// The sample of rail `r`, `src` to `dst`.
    pub fn get(&self, r: usize, src: usize, dst: usize) -> &Sample {
        &self.cells[self.index(r, src, dst)]
    }

    /// Every link direction `(rail, src, dst)`, rail by rail, in host order.
    pub fn links(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let h = self.hosts.len();
        (0..self.rails).flat_map(move |r| {
            (0..h).flat_map(move |s| (0..h).filter(move |&d| d != s).map(move |d| (r, s, d)))
        })
    }

    /// The cells as numbers, four per cell (gbps, lat_us, retrans, segs),
    /// for summing over ranks; [`Matrix::set_flat`] reads them back.
    pub fn flat(&self) -> Vec<f64> {
        self.cells
            .iter()
            .flat_map(|c| [c.gbps, c.lat_us, c.retrans as f64, c.segs as f64])
            .collect()
    }

    /// Sets the cells from [`Matrix::flat`]'s numbers.
    pub fn set_flat(&mut self, v: &[f64]) {
        for (c, x) in self.cells.iter_mut().zip(v.chunks_exact(4)) {
            *c = Sample {
                gbps: x[0],
                lat_us: x[1],
                retrans: x[2] as u64,
                segs: x[3] as u64,
            };
        }
    }
}

/// Thresholds of [`find_outliers`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// A link direction is slow below this fraction of the median
    /// bandwidth (`--fraction`, 0.7).
    pub fraction: f64,
    /// A link is slow to answer above this multiple of the median latency
    /// (`--lat-factor`).
    pub lat_factor: f64,
    /// A link direction is lossy when its sender retransmits more than
    /// this share of its segments (`--loss`).
    pub loss: f64,
    /// The all-reduce is an outlier below this fraction of its bound
    /// (`--ar-fraction`; 0 never).
    pub ar_fraction: f64,
}

/// Default of [`Limits::fraction`].
pub const DEFAULT_FRACTION: f64 = 0.7;
/// Default of [`Limits::lat_factor`]: a latency is a handful of scheduler
/// wake-ups, whose jitter doubles it easily; a lossy or congested link
/// multiplies it by far more.
pub const DEFAULT_LAT_FACTOR: f64 = 4.0;
/// Default of [`Limits::loss`]: a sound link's losses are its switch
/// queue's overflows at full rate, well under 1% of the segments.
pub const DEFAULT_LOSS: f64 = 0.02;
/// Default of [`Limits::ar_fraction`].
pub const DEFAULT_AR_FRACTION: f64 = 0.5;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            fraction: DEFAULT_FRACTION,
            lat_factor: DEFAULT_LAT_FACTOR,
            loss: DEFAULT_LOSS,
            ar_fraction: DEFAULT_AR_FRACTION,
        }
    }
}

/// Why a link direction, link end or host stands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Bandwidth below the fraction of the median.
    Slow,
    /// Latency above the factor of the median.
    Latency,
    /// Retransmissions above the loss share.
    Loss,
}

impl Kind {
    /// The name in the table and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Slow => "bandwidth",
            Kind::Latency => "latency",
            Kind::Loss => "loss",
        }
    }
}

/// Which way traffic is bad at a host's NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dir {
    /// Sending (host to switch).
    Out,
    /// Receiving (switch to host).
    In,
    /// Both ways.
    Both,
}

impl Dir {
    /// The name in the table and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Dir::Out => "out",
            Dir::In => "in",
            Dir::Both => "both",
        }
    }

    fn join(a: Option<Dir>, b: Dir) -> Dir {
        match a {
            None => b,
            Some(a) if a == b => a,
            Some(_) => Dir::Both,
        }
    }
}

/// What an outlier names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    /// A host: its links are bad on every rail (with two rails or more).
    Host {
        /// Host index.
        host: usize,
        /// The way they are bad.
        dir: Dir,
    },
    /// One host's NIC (link to its switch) on one rail.
    HostRail {
        /// Host index.
        host: usize,
        /// Rail.
        rail: usize,
        /// The way it is bad.
        dir: Dir,
    },
    /// One link direction between two hosts that neither end explains (a
    /// path through the switches).
    Link {
        /// Rail.
        rail: usize,
        /// Sending host.
        src: usize,
        /// Receiving host.
        dst: usize,
    },
    /// The all-reduce against its bound.
    AllReduce,
}

/// One finding.
#[derive(Clone, Debug, PartialEq)]
pub struct Outlier {
    /// What it names.
    pub subject: Subject,
    /// Why, in [`Kind`] order.
    pub kinds: Vec<Kind>,
    /// The worst bandwidth among its link directions, Gbit/s (the
    /// all-reduce's busbw for [`Subject::AllReduce`]).
    pub gbps: f64,
    /// What that compares with: the median (the bound for the all-reduce).
    pub reference_gbps: f64,
}

/// The `p`-th quantile of `v` (0..=1, nearest rank below), 0 when empty.
pub fn quantile(v: &[f64], p: f64) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(f64::total_cmp);
    let i = ((s.len() - 1) as f64 * p.clamp(0.0, 1.0)).floor() as usize;
    s[i]
}

/// The median of `v` (mean of the middle two for an even count); 0 when
/// empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The kinds of badness of one link direction under `lim`, given the
/// medians of bandwidth and latency.
pub fn judge(s: &Sample, med_gbps: f64, med_lat: f64, lim: &Limits) -> Vec<Kind> {
    let mut k = Vec::new();
    if s.gbps < lim.fraction * med_gbps {
        k.push(Kind::Slow);
    }
    if med_lat > 0.0 && s.lat_us > lim.lat_factor * med_lat {
        k.push(Kind::Latency);
    }
    if s.loss() > lim.loss {
        k.push(Kind::Loss);
    }
    k
}

/// The outliers of `m` under `lim`, in [`Subject`] order:
///
/// - each link direction (rail, src, dst) is judged against the medians of
///   all of them ([`judge`]);
/// - a bad link direction counts against its sender's NIC (out) or its
///   receiver's (in): the one with the larger share of bad links that way,
///   both when equal; a NIC is bad one way when more than half of its
///   links that way count against it (it takes their kinds): a bad NIC
///   spoils all its links, a bad peer only one of them, and a peer of a bad
///   NIC is not blamed for their link (with two hosts every link is both
///   ends' only one, so both are named);
/// - a host bad on every rail (two rails or more) is named as the host;
/// - a link direction slow or lossy is named as a link unless the NIC of
///   one of its ends on that rail is named (either way, any kind: a NIC
///   found bad one way is suspect both ways, and a slow NIC's queue also
///   overflows); latency alone does not name a link (a moment of
///   scheduling delay lifts all the latencies of one round).
pub fn find_outliers(m: &Matrix, lim: &Limits) -> Vec<Outlier> {
    let h = m.hosts.len();
    if h < 2 || m.rails == 0 {
        return Vec::new();
    }
    let all: Vec<&Sample> = m.links().map(|(r, s, d)| m.get(r, s, d)).collect();
    let med_gbps = median(&all.iter().map(|s| s.gbps).collect::<Vec<_>>());
    let med_lat = median(&all.iter().map(|s| s.lat_us).collect::<Vec<_>>());
    let bad = |r, s, d| judge(m.get(r, s, d), med_gbps, med_lat, lim);
    let end = |r: usize, host: usize, out: bool| (r * h + host) * 2 + usize::from(out);
    // The links of an end: (sender, receiver) of each, to every peer.
    let links_at = |x: usize, out: bool| {
        (0..h)
            .filter(move |&y| y != x)
            .map(move |y| if out { (x, y) } else { (y, x) })
    };
    // Pass 1: each end's share of bad links.
    let mut share = vec![0.0f64; m.rails * h * 2];
    for r in 0..m.rails {
        for x in 0..h {
            for out in [true, false] {
                let n = links_at(x, out)
                    .filter(|&(s, d)| !bad(r, s, d).is_empty())
                    .count();
                share[end(r, x, out)] = n as f64 / (h - 1) as f64;
            }
        }
    }
    // Pass 2: a bad link counts against the end with the larger share (both
    // when equal), so that a peer of a bad NIC is not blamed for it; an
    // end with more than half of its links counted against it is bad, in
    // their kinds.
    let mut ends: Vec<Vec<Kind>> = vec![Vec::new(); m.rails * h * 2];
    for r in 0..m.rails {
        for x in 0..h {
            for out in [true, false] {
                let mine = share[end(r, x, out)];
                let counted: Vec<Vec<Kind>> = links_at(x, out)
                    .map(|(s, d)| {
                        let other = if out {
                            end(r, d, false)
                        } else {
                            end(r, s, true)
                        };
                        if share[other] > mine {
                            Vec::new()
                        } else {
                            bad(r, s, d)
                        }
                    })
                    .filter(|k| !k.is_empty())
                    .collect();
                if 2 * counted.len() > h - 1 {
                    let mut kinds: Vec<Kind> = counted.concat();
                    kinds.sort_unstable();
                    kinds.dedup();
                    ends[end(r, x, out)] = kinds;
                }
            }
        }
    }
    // The worst bandwidth among a set of link directions.
    let worst = |dirs: &mut dyn Iterator<Item = (usize, usize, usize)>| {
        dirs.map(|(r, s, d)| m.get(r, s, d).gbps)
            .fold(f64::INFINITY, f64::min)
    };
    let mut out = Vec::new();
    for x in 0..h {
        let per_rail: Vec<(Option<Dir>, Vec<Kind>)> = (0..m.rails)
            .map(|r| {
                let (o, i) = (&ends[end(r, x, true)], &ends[end(r, x, false)]);
                let mut dir = None;
                if !o.is_empty() {
                    dir = Some(Dir::join(dir, Dir::Out));
                }
                if !i.is_empty() {
                    dir = Some(Dir::join(dir, Dir::In));
                }
                let mut kinds: Vec<Kind> = o.iter().chain(i).copied().collect();
                kinds.sort_unstable();
                kinds.dedup();
                (dir, kinds)
            })
            .collect();
        let links_of = |r: usize, dir: Dir| {
            (0..h).filter(move |&y| y != x).flat_map(move |y| {
                let o = (dir != Dir::In).then_some((r, x, y));
                let i = (dir != Dir::Out).then_some((r, y, x));
                o.into_iter().chain(i)
            })
        };
        if m.rails >= 2 && per_rail.iter().all(|(d, _)| d.is_some()) {
            let dir = per_rail
                .iter()
                .fold(None, |a, (d, _)| Some(Dir::join(a, d.expect("all bad"))))
                .expect("two rails or more");
            let mut kinds: Vec<Kind> = per_rail.iter().flat_map(|(_, k)| k.clone()).collect();
            kinds.sort_unstable();
            kinds.dedup();
            let gbps = worst(&mut (0..m.rails).flat_map(|r| links_of(r, dir)));
            out.push(Outlier {
                subject: Subject::Host { host: x, dir },
                kinds,
                gbps,
                reference_gbps: med_gbps,
            });
            continue;
        }
        for (r, (dir, kinds)) in per_rail.into_iter().enumerate() {
            if let Some(dir) = dir {
                out.push(Outlier {
                    subject: Subject::HostRail {
                        host: x,
                        rail: r,
                        dir,
                    },
                    kinds,
                    gbps: worst(&mut links_of(r, dir)),
                    reference_gbps: med_gbps,
                });
            }
        }
    }
    for (r, s, d) in m.links() {
        // A link with an end named bad is explained by it, whatever the
        // kind or way: a NIC or host found bad one way is suspect both ways.
        let named =
            |x: usize| !ends[end(r, x, true)].is_empty() || !ends[end(r, x, false)].is_empty();
        if named(s) || named(d) {
            continue;
        }
        // Latency names NICs and hosts only: a moment of scheduling delay
        // on a busy host lifts one round's latencies, and a NIC's links
        // span several rounds.
        let kinds: Vec<Kind> = bad(r, s, d)
            .into_iter()
            .filter(|&k| k != Kind::Latency)
            .collect();
        if !kinds.is_empty() {
            out.push(Outlier {
                subject: Subject::Link {
                    rail: r,
                    src: s,
                    dst: d,
                },
                kinds,
                gbps: m.get(r, s, d).gbps,
                reference_gbps: med_gbps,
            });
        }
    }
    out.sort_by(|a, b| a.subject.cmp(&b.subject));
    out
}

/// The bus bandwidth an all-reduce of `nranks` ranks on `nhosts` hosts and
/// `rails` rails can reach when its slowest host link direction carries
/// `slowest_gbps`: every host sends at least `2 (H-1)/H` of the buffer
/// over its links, striped evenly over the rails (so paced by the slowest),
/// while busbw counts `2 (n-1)/n` of it: the bound is
/// `rails * slowest * (n-1)/n * H/(H-1)`. 0 on one host.
pub fn allreduce_bound(nranks: usize, nhosts: usize, rails: usize, slowest_gbps: f64) -> f64 {
    if nhosts < 2 || nranks < 2 {
        return 0.0;
    }
    let (n, h) = (nranks as f64, nhosts as f64);
    rails as f64 * slowest_gbps * (n - 1.0) / n * h / (h - 1.0)
}

/// The all-reduce's finding, if its busbw is below `lim.ar_fraction` of
/// `bound` (never with a zero bound or fraction).
pub fn allreduce_outlier(busbw_gbps: f64, bound_gbps: f64, lim: &Limits) -> Option<Outlier> {
    (bound_gbps > 0.0 && busbw_gbps < lim.ar_fraction * bound_gbps).then(|| Outlier {
        subject: Subject::AllReduce,
        kinds: vec![Kind::Slow],
        gbps: busbw_gbps,
        reference_gbps: bound_gbps,
    })
}

/// The all-reduce measured over the whole job.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AllReduce {
    /// Buffer bytes.
    pub bytes: usize,
    /// Ranks.
    pub nranks: usize,
    /// Bus bandwidth, Gbit/s.
    pub busbw_gbps: f64,
    /// [`allreduce_bound`] from the slowest link direction measured.
    pub bound_gbps: f64,
}

/// A whole run's results.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The link measurements.
    pub matrix: Matrix,
    /// Bytes per message.
    pub bytes: usize,
    /// Messages per burst.
    pub iters: usize,
    /// Passes over the schedule (each link's best counts).
    pub reps: usize,
    /// Rounds run.
    pub rounds: usize,
    /// The all-reduce.
    pub allreduce: AllReduce,
    /// The limits applied.
    pub limits: Limits,
    /// The findings.
    pub outliers: Vec<Outlier>,
}

/// A subject in words: `fck-h2 rail 1 (rail1) in`.
pub fn subject_text(m: &Matrix, s: &Subject) -> String {
    let nic = |h: usize, r: usize| {
        m.nics
            .get(r)
            .and_then(|v| v.get(h))
            .cloned()
            .unwrap_or_default()
    };
    match *s {
        Subject::Host { host, dir } => {
            format!("host {} ({}, every rail)", m.hosts[host], dir.name())
        }
        Subject::HostRail { host, rail, dir } => format!(
            "host {} rail {rail} ({}, {})",
            m.hosts[host],
            nic(host, rail),
            dir.name()
        ),
        Subject::Link { rail, src, dst } => {
            format!("link rail {rail} {} -> {}", m.hosts[src], m.hosts[dst])
        }
        Subject::AllReduce => "all-reduce".to_string(),
    }
}

fn kinds_text(k: &[Kind]) -> String {
    k.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
}

/// The report as text: one row per link direction, the all-reduce, then
/// the outliers (or `none`).
pub fn table(rep: &Report) -> String {
    let m = &rep.matrix;
    let mut t = String::new();
    let nh = m.hosts.len();
    let _ = writeln!(
        t,
        "# fabric_check: {nh} hosts, {} ranks, {} rails; {} rounds; best of {} passes of {} B x {} per link direction",
        rep.allreduce.nranks, m.rails, rep.rounds, rep.reps, rep.bytes, rep.iters
    );
    let w = m.hosts.iter().map(String::len).max().unwrap_or(4).max(4);
    let _ = writeln!(
        t,
        "# {:>4}  {:<w$}  {:<w$}  {:>8}  {:>8}  {:>8}  flag",
        "rail", "from", "to", "Gbit/s", "lat_us", "retr%"
    );
    let med_gbps = median(
        &m.links()
            .map(|(r, s, d)| m.get(r, s, d).gbps)
            .collect::<Vec<_>>(),
    );
    let med_lat = median(
        &m.links()
            .map(|(r, s, d)| m.get(r, s, d).lat_us)
            .collect::<Vec<_>>(),
    );
    for (r, s, d) in m.links() {
        let c = m.get(r, s, d);
        let flag = kinds_text(&judge(c, med_gbps, med_lat, &rep.limits));
        let row = format!(
            "  {r:>4}  {:<w$}  {:<w$}  {:>8.3}  {:>8.1}  {:>8.2}  {}",
            m.hosts[s],
            m.hosts[d],
            c.gbps,
            c.lat_us,
            100.0 * c.loss(),
            flag
        );
        // Rows without a flag end at their last number.
        let _ = writeln!(t, "{}", row.trim_end());
    }
    let _ = writeln!(t, "# median {med_gbps:.3} Gbit/s, {med_lat:.1} us");
    let a = &rep.allreduce;
    if a.nranks > 0 {
        let ratio = if a.bound_gbps > 0.0 {
            a.busbw_gbps / a.bound_gbps
        } else {
            0.0
        };
        let _ = writeln!(
            t,
            "# all-reduce {} B on {} ranks: busbw {:.3} Gbit/s, bound {:.3} (slowest link), {:.2} of it",
            a.bytes, a.nranks, a.busbw_gbps, a.bound_gbps, ratio
        );
    }
    if rep.outliers.is_empty() {
        let _ = writeln!(t, "# outliers: none");
    } else {
        let _ = writeln!(t, "# outliers: {}", rep.outliers.len());
        for o in &rep.outliers {
            let _ = writeln!(
                t,
                "#   {}: {}; worst {:.3} Gbit/s of {:.3}",
                subject_text(m, &o.subject),
                kinds_text(&o.kinds),
                o.gbps,
                o.reference_gbps
            );
        }
    }
    t
}

/// The report as one JSON object: `hosts`, `rails`, `links` (one per link
/// direction), `allreduce`, `outliers` (each with `kind` host, host_rail,
/// link or allreduce, and `host`, `rail`, `dir`, `src`, `dst` as they
/// apply) and `ok`.
pub fn json(rep: &Report) -> String {
    let m = &rep.matrix;
    let mut j = String::from("{");
    let hosts: Vec<String> = m.hosts.iter().map(|h| json::string(h)).collect();
    let _ = write!(j, "\"hosts\":[{}],\"rails\":{},", hosts.join(","), m.rails);
    let nics: Vec<String> = m
        .nics
        .iter()
        .map(|v| {
            format!(
                "[{}]",
                v.iter()
                    .map(|n| json::string(n))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect();
    let _ = write!(
        j,
        "\"nics\":[{}],\"bytes\":{},\"iters\":{},\"reps\":{},\"rounds\":{},",
        nics.join(","),
        rep.bytes,
        rep.iters,
        rep.reps,
        rep.rounds
    );
    let l = &rep.limits;
    let _ = write!(
        j,
        "\"limits\":{{\"fraction\":{},\"lat_factor\":{},\"loss\":{},\"ar_fraction\":{}}},",
        json::number(l.fraction),
        json::number(l.lat_factor),
        json::number(l.loss),
        json::number(l.ar_fraction)
    );
    let links: Vec<String> = m
        .links()
        .map(|(r, s, d)| {
            let c = m.get(r, s, d);
            format!(
                "{{\"rail\":{r},\"src\":{},\"dst\":{},\"gbps\":{},\"lat_us\":{},\"retrans\":{},\"segs\":{}}}",
                json::string(&m.hosts[s]),
                json::string(&m.hosts[d]),
                json::number(c.gbps),
                json::number(c.lat_us),
                c.retrans,
                c.segs
            )
        })
        .collect();
    let _ = write!(j, "\"links\":[{}],", links.join(","));
    let a = &rep.allreduce;
    let _ = write!(
        j,
        "\"allreduce\":{{\"bytes\":{},\"nranks\":{},\"busbw_gbps\":{},\"bound_gbps\":{}}},",
        a.bytes,
        a.nranks,
        json::number(a.busbw_gbps),
        json::number(a.bound_gbps)
    );
    let outs: Vec<String> = rep
        .outliers
        .iter()
        .map(|o| {
            let what = match o.subject {
                Subject::Host { host, dir } => format!(
                    "\"kind\":\"host\",\"host\":{},\"dir\":\"{}\"",
                    json::string(&m.hosts[host]),
                    dir.name()
                ),
                Subject::HostRail { host, rail, dir } => format!(
                    "\"kind\":\"host_rail\",\"host\":{},\"rail\":{rail},\"dir\":\"{}\"",
                    json::string(&m.hosts[host]),
                    dir.name()
                ),
                Subject::Link { rail, src, dst } => format!(
                    "\"kind\":\"link\",\"rail\":{rail},\"src\":{},\"dst\":{}",
                    json::string(&m.hosts[src]),
                    json::string(&m.hosts[dst])
                ),
                Subject::AllReduce => "\"kind\":\"allreduce\"".to_string(),
            };
            let why: Vec<String> = o.kinds.iter().map(|k| json::string(k.name())).collect();
            format!(
                "{{{what},\"why\":[{}],\"gbps\":{},\"reference_gbps\":{}}}",
                why.join(","),
                json::number(o.gbps),
                json::number(o.reference_gbps)
            )
        })
        .collect();
    let _ = write!(
        j,
        "\"outliers\":[{}],\"ok\":{}}}",
        outs.join(","),
        rep.outliers.is_empty()
    );
    j.push('\n');
    j
}

/// `/proc/net/snmp`'s TCP counters `(RetransSegs, OutSegs)`; `None` when
/// the text has no such pair of `Tcp:` lines.
pub fn parse_snmp_tcp(text: &str) -> Option<(u64, u64)> {
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let names: Vec<&str> = tcp.next()?.split_whitespace().collect();
    let values: Vec<&str> = tcp.next()?.split_whitespace().collect();
    if names.len() != values.len() {
        return None;
    }
    let get = |want: &str| {
        names
            .iter()
            .position(|n| *n == want)
            .and_then(|i| values[i].parse::<u64>().ok())
    };
    Some((get("RetransSegs")?, get("OutSegs")?))
}

/// `fabric_check`'s flags.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Bytes per message on a link direction (`-b`, `--size`).
    pub bytes: usize,
    /// Messages per burst (`-n`, `--iters`).
    pub iters: usize,
    /// Passes over the whole schedule, each link's best counting
    /// (`--reps`): a link's capacity shows in its best pass, and passes
    /// seconds apart let a moment's stall of a busy host spoil one only.
    pub reps: usize,
    /// Small-message round trips per link (`--lat-iters`).
    pub lat_iters: usize,
    /// All-reduce bytes (`--ar-size`; 0 skips it).
    pub ar_bytes: usize,
    /// Timed all-reduces (`--ar-iters`).
    pub ar_iters: usize,
    /// Pairs measured at once within a round (`--max-pairs`; 0: the whole
    /// round).
    pub max_pairs: usize,
    /// Deadline of each measurement, seconds (`--timeout`).
    pub timeout_s: f64,
    /// Thresholds.
    pub limits: Limits,
    /// Where to write the JSON report (`--json`).
    pub json: Option<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            bytes: 4 << 20,
            iters: 4,
            reps: 3,
            lat_iters: 100,
            ar_bytes: 16 << 20,
            ar_iters: 5,
            max_pairs: 0,
            timeout_s: 60.0,
            limits: Limits::default(),
            json: None,
        }
    }
}

/// The help text.
pub fn usage() -> String {
    let d = Options::default();
    format!(
        "Usage: fabric_check [options]   (on every rank of a job: ncclrun, mpirun, srun, torchrun)\n\
         Measures every pair of hosts on every rail, in rounds whose pairs share no host link,\n\
         then an all-reduce; names the outliers and exits 1 if there are any.\n\
         \x20 -b, --size BYTES      bytes per message on a link direction (default {})\n\
         \x20 -n, --iters N         messages per burst, one burst per link direction and pass (default {})\n\
         \x20     --reps N          passes over all pairs and rails, each link's best counts (default {})\n\
         \x20     --lat-iters N     small-message round trips per link (default {})\n\
         \x20     --ar-size BYTES   all-reduce bytes, 0 to skip it (default {})\n\
         \x20     --ar-iters N      timed all-reduces (default {})\n\
         \x20     --max-pairs N     pairs measured at once within a round, 0 = all (default 0)\n\
         \x20     --fraction F      bandwidth outlier below F x the median (default {})\n\
         \x20     --lat-factor F    latency outlier above F x the median (default {})\n\
         \x20     --loss F          loss outlier above F of segments retransmitted (default {})\n\
         \x20     --ar-fraction F   all-reduce outlier below F x its bound, 0 = never (default {})\n\
         \x20     --timeout SECS    deadline of each measurement (default {})\n\
         \x20     --json FILE       also write the report as JSON\n\
         \x20 -h, --help            this text\n\
         Exit status: 0 no outlier, 1 outliers, 2 bad usage or a failed measurement.\n",
        d.bytes,
        d.iters,
        d.reps,
        d.lat_iters,
        d.ar_bytes,
        d.ar_iters,
        d.limits.fraction,
        d.limits.lat_factor,
        d.limits.loss,
        d.limits.ar_fraction,
        d.timeout_s
    )
}

/// Parses the flags (without the program name); `Ok(None)` for `-h`.
pub fn parse_options<I, S>(argv: I) -> Result<Option<Options>, String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut o = Options::default();
    let mut it = argv.into_iter().map(|s| s.as_ref().to_string());
    let count = |flag: &str, v: &str, min: usize| -> Result<usize, String> {
        match v.parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(format!("{flag} {v:?}: want an integer >= {min}")),
        }
    };
    let frac = |flag: &str, v: &str, lo: f64, hi: f64| -> Result<f64, String> {
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
            _ => Err(format!("{flag} {v:?}: want a number in {lo}..{hi}")),
        }
    };
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let v = it
            .next()
            .ok_or_else(|| format!("{flag}: missing value (or unknown flag)"))?;
        match flag.as_str() {
            "-b" | "--size" => {
                o.bytes = crate::args::size_arg(&v)?;
                if o.bytes == 0 {
                    return Err(format!("{flag} {v:?}: want at least 1 byte"));
                }
            }
            "-n" | "--iters" => o.iters = count(&flag, &v, 1)?,
            "--reps" => o.reps = count(&flag, &v, 1)?,
            "--lat-iters" => o.lat_iters = count(&flag, &v, 1)?,
            "--ar-size" => o.ar_bytes = crate::args::size_arg(&v)?,
            "--ar-iters" => o.ar_iters = count(&flag, &v, 1)?,
            "--max-pairs" => o.max_pairs = count(&flag, &v, 0)?,
            "--fraction" => o.limits.fraction = frac(&flag, &v, 0.0, 1.0)?,
            "--lat-factor" => o.limits.lat_factor = frac(&flag, &v, 1.0, 1e9)?,
            "--loss" => o.limits.loss = frac(&flag, &v, 0.0, 1.0)?,
            "--ar-fraction" => o.limits.ar_fraction = frac(&flag, &v, 0.0, 1.0)?,
            "--timeout" => o.timeout_s = frac(&flag, &v, 0.001, 1e9)?,
            "--json" => o.json = Some(v),
            _ => return Err(format!("unknown flag {flag:?} (see -h)")),
        }
    }
    Ok(Some(o))
}

#[cfg(test)]
mod tests;
