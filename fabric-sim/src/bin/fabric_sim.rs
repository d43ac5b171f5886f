//! `fabric_sim`: nccl-rs's schedules on a simulated fabric. See
//! `fabric_sim --help` and docs/simulation.md.

use fabric_sim::gen::{self, Cluster, LeafSpine, Rails};
use fabric_sim::net::Ecmp;
use fabric_sim::sim::{self, Costs, HostOrder, Job, Outcome, Placement, RailUse, Setup};
use fabric_sim::svg::{self, Panel, Series, XUnit};
use nccl_rs::json;
use std::fmt::Write as _;
use std::process::ExitCode;

const HELP: &str = "\
fabric_sim: run nccl-rs's own schedules on a simulated fabric

Fabric (a generator, or --topo):
  --fabric two-tier|three-tier|fat-tree   generator (default two-tier)
  --topo FILE            Slurm topology.conf (hosts are its nodes)
  --nic-gbps G           NIC speed, Gbit/s (400)
  --rails R              NICs per host (1)
  --rails-layout L[,L..] shared | optimized (rail-optimized) | planes (1 network per rail); a list sweeps (shared)
  --hosts-per-leaf K     hosts per leaf (16)
  --spines S             spines per leaf, 0: NIC ports / oversub (0)
  --radix K              leaf ports: split into NIC ports and uplinks by the oversubscription
                         (sets --hosts-per-leaf and --spines; one uplink per spine)
  --oversub O[,O..]      leaf uplink oversubscription; a list sweeps (1)
  --leaves-per-pod P     three-tier: leaves per pod (8)
  --cores C              three-tier: core switches (8)
  --oversub2 O           three-tier: pod-to-core oversubscription (1)
  --k K                  fat tree arity (8)
  --link-latency-us T    every cable's latency (0.5)
Job:
  --ranks N[,N..]        rank counts; a list sweeps (64)
  --ranks-per-host L     (8)
  --placement block|cyclic   (block)
  --host-order packed|spread the job's hosts: whole leaves, or one leaf after the other (packed)
Call:
  --op OP[,OP..]         allreduce allgather reducescatter broadcast reduce alltoall (allreduce)
  --sizes S[,S..]        bytes (K, M, G suffixes), nccl-tests' meaning (64M)
  -b MIN -e MAX -f F     sizes MIN, MIN*F, ..., MAX instead of --sizes
  --algo A[,A..]         planner | ring | hier | tree | hd | direct ... (NCCL_ALGO values; planner)
  --proto P              NCCL_PROTO
  --ring-order topo|rank (topo)
  --ecmp hash|spread     path choice over equal-cost uplinks (hash)
  --seed S               ECMP hash seed (1)
  --rail-use stripe|affinity  (stripe: nccl-rs over TCP)
  --transport NAME       transport between hosts for the planner's model (Socket)
  --alpha-us T           per-message overhead (5)
  --goodput F            payload fraction of link rates (1)
  --intra-gbps G         shared memory (NVLink-class) per rank, Gbit/s (3600)
  --chunk-bytes B        pipelining chunk (the library's slot)
  --full                 expand every rank's schedule (no symmetric shortcut)
Output:
  (default) an nccl-tests-style table; --csv; --json; --svg FILE (busbw vs size and vs ranks)
  --hot N                bottleneck links per row in the table (1)
";

#[derive(Clone, Debug)]
struct Args {
    fabric: String,
    topo: Option<String>,
    nic_gbps: f64,
    rails: usize,
    layouts: Vec<Rails>,
    hpl: usize,
    spines: usize,
    radix: Option<usize>,
    oversub: Vec<f64>,
    lpp: usize,
    cores: usize,
    oversub2: f64,
    k: usize,
    link_latency: f64,
    ranks: Vec<usize>,
    local: usize,
    placement: Placement,
    order: HostOrder,
    ops: Vec<String>,
    sizes: Vec<usize>,
    algos: Vec<String>,
    setup: Setup,
    csv: bool,
    json: bool,
    svg: Option<String>,
    hot: usize,
}

fn size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|n| n * mul)
        .map_err(|_| format!("not a size: {s:?}"))
}

fn list<T>(s: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    s.split(',').filter(|x| !x.is_empty()).map(f).collect()
}

fn num<T: std::str::FromStr>(flag: &str, s: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{flag}: not a number: {s:?}"))
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        fabric: "two-tier".into(),
        topo: None,
        nic_gbps: 400.0,
        rails: 1,
        layouts: vec![Rails::Shared],
        hpl: 16,
        spines: 0,
        radix: None,
        oversub: vec![1.0],
        lpp: 8,
        cores: 8,
        oversub2: 1.0,
        k: 8,
        link_latency: 0.5e-6,
        ranks: vec![64],
        local: 8,
        placement: Placement::Block,
        order: HostOrder::Packed,
        ops: vec!["allreduce".into()],
        sizes: vec![64 << 20],
        algos: vec!["planner".into()],
        setup: Setup {
            costs: Costs {
                intra_rate: gen::gbps(3600.0),
                ..Costs::default()
            },
            ..Setup::default()
        },
        csv: false,
        json: false,
        svg: None,
        hot: 1,
    };
    let (mut b, mut e, mut f) = (None, None, 2usize);
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--fabric" => a.fabric = val()?,
            "--topo" => a.topo = Some(val()?),
            "--nic-gbps" => a.nic_gbps = num(flag, &val()?)?,
            "--rails" => a.rails = num(flag, &val()?)?,
            "--rails-layout" => {
                a.layouts = list(&val()?, |v| match v {
                    "shared" => Ok(Rails::Shared),
                    "optimized" | "rail" | "rail-optimized" => Ok(Rails::Optimized),
                    "planes" => Ok(Rails::Planes),
                    v => Err(format!("--rails-layout: unknown {v:?}")),
                })?
            }
            "--hosts-per-leaf" => a.hpl = num(flag, &val()?)?,
            "--spines" => a.spines = num(flag, &val()?)?,
            "--radix" => a.radix = Some(num(flag, &val()?)?),
            "--oversub" => a.oversub = list(&val()?, |s| num(flag, s))?,
            "--leaves-per-pod" => a.lpp = num(flag, &val()?)?,
            "--cores" => a.cores = num(flag, &val()?)?,
            "--oversub2" => a.oversub2 = num(flag, &val()?)?,
            "--k" => a.k = num(flag, &val()?)?,
            "--link-latency-us" => a.link_latency = num::<f64>(flag, &val()?)? * 1e-6,
            "--ranks" => a.ranks = list(&val()?, |s| num(flag, s))?,
            "--ranks-per-host" => a.local = num(flag, &val()?)?,
            "--placement" => {
                a.placement = match val()?.as_str() {
                    "block" | "slot" => Placement::Block,
                    "cyclic" | "node" => Placement::Cyclic,
                    v => return Err(format!("--placement: unknown {v:?}")),
                }
            }
            "--host-order" => {
                a.order = match val()?.as_str() {
                    "packed" => HostOrder::Packed,
                    "spread" => HostOrder::Spread,
                    v => return Err(format!("--host-order: unknown {v:?}")),
                }
            }
            "--op" => a.ops = list(&val()?, |s| Ok(s.to_string()))?,
            "--sizes" => a.sizes = list(&val()?, size)?,
            "-b" => b = Some(size(&val()?)?),
            "-e" => e = Some(size(&val()?)?),
            "-f" => f = num(flag, &val()?)?,
            "--algo" => a.algos = list(&val()?, |s| Ok(s.to_string()))?,
            "--proto" => a.setup.proto = Some(val()?),
            "--ring-order" => a.setup.ring_by_topology = val()? != "rank",
            "--ecmp" => {
                a.setup.ecmp = match val()?.as_str() {
                    "hash" => Ecmp::Hash { seed: 1 },
                    "spread" | "ideal" => Ecmp::Spread,
                    v => return Err(format!("--ecmp: unknown {v:?}")),
                }
            }
            "--seed" => {
                let seed = num(flag, &val()?)?;
                if let Ecmp::Hash { .. } = a.setup.ecmp {
                    a.setup.ecmp = Ecmp::Hash { seed };
                }
            }
            "--rail-use" => {
                a.setup.rails = match val()?.as_str() {
                    "stripe" => RailUse::Stripe,
                    "affinity" => RailUse::Affinity,
                    v => return Err(format!("--rail-use: unknown {v:?}")),
                }
            }
            "--transport" => a.setup.net_transport = val()?,
            "--alpha-us" => a.setup.costs.alpha = num::<f64>(flag, &val()?)? * 1e-6,
            "--goodput" => a.setup.costs.goodput = num(flag, &val()?)?,
            "--intra-gbps" => a.setup.costs.intra_rate = gen::gbps(num(flag, &val()?)?),
            "--chunk-bytes" => a.setup.chunk_bytes = Some(size(&val()?)?),
            "--full" => a.setup.symmetric = false,
            "--csv" => a.csv = true,
            "--json" => a.json = true,
            "--svg" => a.svg = Some(val()?),
            "--hot" => a.hot = num(flag, &val()?)?,
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    if let (Some(b), Some(e)) = (b, e.or(b)) {
        if f < 2 || b == 0 || e < b {
            return Err("-b/-e/-f: need 0 < MIN <= MAX and F >= 2".into());
        }
        a.sizes.clear();
        let mut s = b;
        while s <= e {
            a.sizes.push(s);
            s = s.saturating_mul(f);
        }
    }
    let c = &a.setup.costs;
    if !(c.goodput > 0.0 && c.goodput <= 1.0) {
        return Err("--goodput must be in (0, 1]".into());
    }
    if !(a.nic_gbps > 0.0 && c.intra_rate > 0.0 && c.alpha >= 0.0 && a.link_latency >= 0.0) {
        return Err("rates must be positive, --alpha-us and --link-latency-us not negative".into());
    }
    // NaN is not >= 1 either.
    if a.oversub.is_empty() || !a.oversub.iter().all(|o| *o >= 1.0) {
        return Err("--oversub values must be >= 1".into());
    }
    if a.ranks.iter().any(|&n| n == 0 || n % a.local.max(1) != 0) || a.local == 0 {
        return Err(format!(
            "--ranks must be multiples of --ranks-per-host ({})",
            a.local
        ));
    }
    Ok(a)
}

fn cluster(a: &Args, hosts: usize, oversub: f64, layout: Rails) -> Result<Cluster, String> {
    if let Some(path) = &a.topo {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let mut o = vec![oversub];
        if a.oversub2 != 1.0 {
            o.push(a.oversub2);
        }
        return gen::from_topology_conf(
            &text,
            Some(hosts),
            a.rails,
            a.nic_gbps,
            &o,
            a.link_latency,
        );
    }
    match a.fabric.as_str() {
        "fat-tree" => gen::fat_tree(a.k, a.nic_gbps, a.link_latency),
        "two-tier" | "three-tier" => LeafSpine {
            hosts,
            rails: a.rails,
            nic_gbps: a.nic_gbps,
            hosts_per_leaf: match a.radix {
                Some(k) => radix_split(k, oversub, a.rails, layout)?.0,
                None => a.hpl,
            },
            spines: match a.radix {
                Some(k) => radix_split(k, oversub, a.rails, layout)?.1,
                None => a.spines,
            },
            oversub,
            rails_layout: layout,
            leaves_per_pod: if a.fabric == "three-tier" { a.lpp } else { 0 },
            cores: a.cores,
            oversub2: a.oversub2,
            link_latency: a.link_latency,
        }
        .build(),
        f => Err(format!("--fabric: unknown {f:?}")),
    }
}

/// A leaf of `k` ports at `oversub`: (hosts per leaf, uplinks). NIC
/// ports are `k · o / (1 + o)` rounded down to whole hosts (a host's
/// `rails` NICs, or one NIC per host on rail-optimized leaves); the rest
/// go up.
fn radix_split(
    k: usize,
    oversub: f64,
    rails: usize,
    layout: Rails,
) -> Result<(usize, usize), String> {
    let per_host = if layout == Rails::Shared { rails } else { 1 };
    let nic_ports = (k as f64 * oversub / (1.0 + oversub)).floor() as usize;
    let hosts = nic_ports / per_host.max(1);
    let up = k.saturating_sub(hosts * per_host);
    if hosts == 0 || up == 0 {
        return Err(format!(
            "--radix {k} leaves no room for hosts and uplinks at {oversub}:1"
        ));
    }
    Ok((hosts, up))
}

struct Row {
    layout: Rails,
    op: String,
    ranks: usize,
    oversub: f64,
    algo: String,
    out: Outcome,
}

fn run(a: &Args) -> Result<(), String> {
    let mut rows = Vec::new();
    let mut summaries = Vec::new();
    for &n in &a.ranks {
        let hosts = n / a.local;
        for (&o, &layout) in a
            .oversub
            .iter()
            .flat_map(|o| a.layouts.iter().map(move |l| (o, l)))
        {
            let c = cluster(a, hosts, o, layout)?;
            summaries.push(c.summary.clone());
            let base = Job::with_order(c, hosts, a.local, a.placement, a.order, &a.setup.costs)?;
            for op in &a.ops {
                for &s in &a.sizes {
                    for algo in &a.algos {
                        let mut job = base.clone();
                        let setup = Setup {
                            algo: (algo != "planner").then(|| algo.clone()),
                            ..a.setup.clone()
                        };
                        let coll = sim::collective(op, s, n)?;
                        let out = sim::simulate(&mut job, coll, &setup)?;
                        rows.push(Row {
                            layout,
                            op: op.clone(),
                            ranks: n,
                            oversub: o,
                            algo: algo.clone(),
                            out,
                        });
                    }
                }
            }
        }
    }
    summaries.dedup();
    let mut text = String::new();
    if a.json {
        text.push_str("[\n");
        for (i, r) in rows.iter().enumerate() {
            let hot: Vec<String> = r
                .out
                .hot
                .iter()
                .map(|h| {
                    format!(
                        "{{\"link\":{},\"utilisation\":{:.6},\"bytes\":{}}}",
                        json::string(&h.link),
                        h.utilisation,
                        h.bytes
                    )
                })
                .collect();
            let _ = writeln!(
                text,
                "  {{\"layout\":\"{:?}\",\"op\":{},\"bytes\":{},\"ranks\":{},\"oversub\":{},\"algo\":{},\"algorithm\":{},\"time_us\":{:.3},\"algbw_gbs\":{:.6},\"busbw_gbs\":{:.6},\"planner_us\":{},\"levels\":{},\"patterns\":{},\"mode\":{},\"hot\":[{}]}}{}",
                r.layout,
                json::string(&r.op),
                r.out.bytes,
                r.ranks,
                r.oversub,
                json::string(&r.algo),
                json::string(&r.out.algorithm),
                r.out.time * 1e6,
                r.out.algbw / 1e9,
                r.out.busbw / 1e9,
                r.out.planner.map_or("null".into(), |t| format!("{:.3}", t * 1e6)),
                r.out.levels,
                r.out.patterns,
                json::string(r.out.mode),
                hot.join(","),
                if i + 1 < rows.len() { "," } else { "" }
            );
        }
        text.push_str("]\n");
    } else if a.csv {
        text.push_str("op,bytes,ranks,oversub,algo,algorithm,time_us,algbw_gbs,busbw_gbs,planner_us,hot_link,hot_util,layout\n");
        for r in &rows {
            let h = r.out.hot.first();
            let _ = writeln!(
                text,
                "{},{},{},{},{},{},{:.3},{:.6},{:.6},{},{},{:.4},{:?}",
                r.op,
                r.out.bytes,
                r.ranks,
                r.oversub,
                r.algo,
                r.out.algorithm,
                r.out.time * 1e6,
                r.out.algbw / 1e9,
                r.out.busbw / 1e9,
                r.out
                    .planner
                    .map_or(String::new(), |t| format!("{:.3}", t * 1e6)),
                h.map_or("", |h| &h.link),
                h.map_or(0.0, |h| h.utilisation),
                r.layout
            );
        }
    } else {
        for s in &summaries {
            let _ = writeln!(text, "# {s}");
        }
        let _ = writeln!(
            text,
            "# {} ranks per host, {:?} placement, {:?} hosts, ECMP {:?}, rails {:?}, alpha {} us, goodput {}",
            a.local, a.placement, a.order, a.setup.ecmp, a.setup.rails, a.setup.costs.alpha * 1e6, a.setup.costs.goodput
        );
        let _ = writeln!(
            text,
            "#{:>13} {:>14} {:>7} {:>6} {:>8} {:>13} {:>13} {:>10} {:>10} {:>12}  bottleneck (utilisation)",
            "op", "size(B)", "ranks", "over", "algo", "algorithm", "time(us)", "algbw", "busbw", "planner(us)"
        );
        for r in &rows {
            let hot: Vec<String> = r
                .out
                .hot
                .iter()
                .take(a.hot)
                .map(|h| format!("{} ({:.2})", h.link, h.utilisation))
                .collect();
            let _ = writeln!(
                text,
                "{:>14} {:>14} {:>7} {:>6} {:>8} {:>13} {:>13.1} {:>10.2} {:>10.2} {:>12}  {}",
                r.op,
                r.out.bytes,
                r.ranks,
                format!("{}:1", r.oversub),
                r.algo,
                r.out.algorithm,
                r.out.time * 1e6,
                r.out.algbw / 1e9,
                r.out.busbw / 1e9,
                r.out
                    .planner
                    .map_or("-".into(), |t| format!("{:.1}", t * 1e6)),
                hot.join(", ")
            );
        }
    }
    print!("{text}");
    if let Some(path) = &a.svg {
        std::fs::write(path, plot(a, &rows)).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

/// busbw against size (at the largest rank count) and against ranks (at
/// the largest size), one line per (op, algorithm, oversubscription).
fn plot(a: &Args, rows: &[Row]) -> String {
    let nmax = a.ranks.iter().copied().max().unwrap_or(0);
    let smax = a.sizes.iter().copied().max().unwrap_or(0);
    let label = |r: &Row| {
        let mut l = String::new();
        if a.ops.len() > 1 {
            l += &format!("{} ", r.op);
        }
        l += &r.algo;
        if a.layouts.len() > 1 {
            l += match r.layout {
                Rails::Shared => "",
                Rails::Optimized => " rail-opt",
                Rails::Planes => " planes",
            };
        }
        if a.oversub.len() > 1 {
            l += &format!(" {}:1", r.oversub);
        }
        l
    };
    let series = |keep: &dyn Fn(&Row) -> bool, x: &dyn Fn(&Row) -> f64| {
        let mut out: Vec<Series> = Vec::new();
        for r in rows.iter().filter(|r| keep(r)) {
            let (lab, pt) = (label(r), (x(r), r.out.busbw / 1e9));
            match out.iter_mut().find(|s| s.label == lab) {
                Some(s) => s.points.push(pt),
                None => out.push(Series {
                    label: lab,
                    points: vec![pt],
                }),
            }
        }
        out
    };
    let mut panels = Vec::new();
    if a.sizes.len() > 1 {
        panels.push(Panel {
            title: format!("busbw vs size, {nmax} ranks"),
            x_label: "size (bytes)".into(),
            y_label: "busbw (GB/s)".into(),
            x_unit: XUnit::Bytes,
            series: series(&|r: &Row| r.ranks == nmax, &|r: &Row| r.out.bytes as f64),
        });
    }
    if a.ranks.len() > 1 || panels.is_empty() {
        panels.push(Panel {
            title: format!("busbw vs ranks, {}B", svg::tick(smax as f64, XUnit::Bytes)),
            x_label: "ranks".into(),
            y_label: "busbw (GB/s)".into(),
            x_unit: XUnit::Count,
            series: series(
                &|r: &Row| {
                    sim::collective(&r.op, smax, r.ranks).map(|c| c.bytes(r.ranks, sim::DTYPE))
                        == Ok(r.out.bytes)
                },
                &|r: &Row| r.ranks as f64,
            ),
        });
    }
    svg::render(&panels)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match parse(&argv).and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_empty() => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fabric_sim: {e}");
            ExitCode::from(2)
        }
    }
}
