//! One rank of the soak tests (`tests/tests/soak.rs`). `SOAK_MODE`:
//!
//! - `random`: `SOAK_COUNT` random collectives (collective, datatype, op,
//!   in/out of place, count and root drawn from `SOAK_SEED`, identically on
//!   every rank; counts mostly small), each checked exactly by `cases::run`;
//! - `cycles`: `SOAK_CYCLES` communicator init / all-reduce / destroy cycles
//!   from the launcher environment (one process per rank), watching this
//!   process's file descriptors, threads, `/dev/shm/nccl-rs-<pid>-*`
//!   segment names, mapped `nccl-rs-*` segments and RSS;
//! - `cycles-threads`: the same with all `SOAK_RANKS` ranks as threads of
//!   this one process (rank 0's thread creates the unique id).
//!
//! Prints `SOAK ...` / `CYCLES ...` summary lines; exits 0 when every
//! result was exact and no resource grew beyond the bounds: no more file
//! descriptors, threads or segments than after warm-up, and RSS growth
//! below `SOAK_RSS_BOUND_MIB` (default 20 MiB).

use nccl_rs::{Communicator, Config, RedOp, UniqueId};
use nccl_tests_suite::cases::{matrix, run, Case, Coll};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_num<T: std::str::FromStr>(k: &str, default: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() {
    nccl_rs::init_logging();
    let mode = std::env::var("SOAK_MODE").unwrap_or_else(|_| "random".into());
    let cfg = Config::from_env().unwrap_or_else(|e| die(&format!("config: {e}")));
    let code = match mode.as_str() {
        "random" => random(&cfg),
        "cycles" => cycles(&cfg, false),
        "cycles-threads" => cycles(&cfg, true),
        other => die(&format!("unknown SOAK_MODE {other:?}")),
    };
    std::process::exit(code);
}

fn die(msg: &str) -> ! {
    say(format!("ERROR {msg}"));
    std::process::exit(2)
}

/// splitmix64: a seeded stream of random numbers, identical on every rank.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A random element count: 60% up to 64, 30% up to 4 Ki, 9% up to 64 Ki,
/// 1% up to 1 Mi (per rank or per peer, as the collective counts).
fn random_count(rng: &mut Rng) -> usize {
    let r = rng.below(1000);
    let (lo, hi) = match r {
        0..=599 => (0, 64),
        600..=899 => (65, 4096),
        900..=989 => (4097, 65_536),
        _ => (65_537, 1 << 20),
    };
    (lo + rng.below(hi - lo + 1)) as usize
}

fn random(cfg: &Config) -> i32 {
    let count: u64 = env_num("SOAK_COUNT", 2000);
    let seed: u64 = env_num("SOAK_SEED", 1);
    let mut comm = Communicator::init_from_env(cfg).unwrap_or_else(|e| die(&format!("init: {e}")));
    let (rank, n) = (comm.rank(), comm.size());
    // Every valid (collective, datatype, op, in-place) combination, by
    // collective; the collective is drawn uniformly, then its shape, count
    // and root.
    let all = matrix(n);
    let shapes: Vec<Vec<Case>> = Coll::ALL
        .iter()
        .map(|&c| {
            all.iter()
                .filter(|s| s.coll == c)
                .copied()
                .collect::<Vec<_>>()
        })
        .filter(|v| !v.is_empty())
        .collect();
    let mut rng = Rng(seed);
    let mut per: BTreeMap<String, u64> = BTreeMap::new();
    let (mut failed, mut elements) = (0u64, 0u64);
    let start = Instant::now();
    for i in 0..count {
        let of = &shapes[rng.below(shapes.len() as u64) as usize];
        let shape = of[rng.below(of.len() as u64) as usize];
        let case = Case {
            count: random_count(&mut rng),
            root: rng.below(n as u64) as usize,
            ..shape
        };
        elements += case.count as u64;
        *per.entry(format!("{:?}", case.coll)).or_default() += 1;
        match run(
            &mut comm,
            &case,
            seed ^ i.wrapping_mul(0x2545_F491_4F6C_DD1D),
        ) {
            Ok(0) => {}
            Ok(wrong) => {
                failed += 1;
                say(format!(
                    "WRONG rank {rank} call {i} {case:?}: {wrong} wrong elements"
                ));
            }
            Err(e) => die(&format!("rank {rank} call {i} {case:?}: {e}")),
        }
        if rank == 0 && (i + 1) % 5000 == 0 {
            say(format!(
                "PROGRESS {} collectives, {:.1} s",
                i + 1,
                start.elapsed().as_secs_f64()
            ));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mix: Vec<String> = per.iter().map(|(k, v)| format!("{k}={v}")).collect();
    say(format!(
        "SOAK rank {rank} of {n}: {count} random collectives (seed {seed}), {failed} wrong, {elements} elements, {secs:.1} s ({:.0} us/collective); {}",
        secs * 1e6 / count.max(1) as f64,
        mix.join(" ")
    ));
    drop(comm);
    i32::from(failed != 0)
}

/// This process's resources.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    fds: usize,
    threads: usize,
    shm: usize,
    shm_maps: usize,
    rss_kib: usize,
}

impl Usage {
    fn now() -> Usage {
        let fds = std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count())
            .unwrap_or(0);
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| -> usize {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let prefix = format!("nccl-rs-{}-", std::process::id());
        let shm = std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .count()
            })
            .unwrap_or(0);
        // Names are unlinked once connected: live segments show as
        // mappings of `/dev/shm/nccl-rs-*` (deleted).
        let shm_maps = std::fs::read_to_string("/proc/self/maps")
            .map(|m| {
                m.lines()
                    .filter(|l| l.contains("/dev/shm/nccl-rs-"))
                    .count()
            })
            .unwrap_or(0);
        Usage {
            fds,
            threads: field("Threads:"),
            shm,
            shm_maps,
            rss_kib: field("VmRSS:"),
        }
    }

    fn max(self, o: Usage) -> Usage {
        Usage {
            fds: self.fds.max(o.fds),
            threads: self.threads.max(o.threads),
            shm: self.shm.max(o.shm),
            shm_maps: self.shm_maps.max(o.shm_maps),
            rss_kib: self.rss_kib.max(o.rss_kib),
        }
    }
}

/// One init / checked all-reduce / destroy cycle of one rank; returns
/// this process's resources while the communicator was live.
fn one_cycle(comm: nccl_rs::Result<Communicator>, cycle: usize) -> Result<Usage, String> {
    let mut comm = comm.map_err(|e| format!("cycle {cycle}: init: {e}"))?;
    let (rank, n) = (comm.rank(), comm.size());
    let send = vec![(rank + 1) as f32; 1024];
    let mut recv = vec![0f32; 1024];
    comm.all_reduce(&send, &mut recv, RedOp::Sum)
        .map_err(|e| format!("cycle {cycle}: all_reduce: {e}"))?;
    let want = (n * (n + 1) / 2) as f32;
    if recv.iter().any(|&x| x != want) {
        return Err(format!("cycle {cycle}: wrong all_reduce result"));
    }
    let live = Usage::now();
    drop(comm);
    Ok(live)
}

fn cycles(cfg: &Config, threads: bool) -> i32 {
    let cycles: usize = env_num("SOAK_CYCLES", 100);
    let warmup: usize = env_num("SOAK_WARMUP", 10).min(cycles / 2);
    let rss_bound_mib: usize = env_num("SOAK_RSS_BOUND_MIB", 20);
    let nthreads: usize = env_num("SOAK_RANKS", 4);
    let who = if threads {
        format!("{nthreads} ranks as threads of pid {}", std::process::id())
    } else {
        format!("rank {}", env_num("RANK", 0usize))
    };
    let start = Instant::now();
    let mut base = Usage::default();
    let mut peak = Usage::default();
    for c in 0..cycles {
        if c == warmup {
            base = settle(Usage::now(), None);
            peak = base;
        }
        let res = if threads {
            let id = UniqueId::new(cfg).map_err(|e| format!("cycle {c}: unique id: {e}"));
            match id {
                Err(e) => Err(e),
                Ok(id) => {
                    let cfg = Arc::new(cfg.clone());
                    let hs: Vec<_> = (0..nthreads)
                        .map(|r| {
                            let cfg = cfg.clone();
                            std::thread::spawn(move || {
                                one_cycle(Communicator::init(&id, nthreads, r, &cfg), c)
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| {
                            h.join()
                                .unwrap_or_else(|_| Err("rank thread panicked".into()))
                        })
                        .collect::<Result<Vec<Usage>, String>>()
                        .map(|v| v.into_iter().fold(Usage::default(), Usage::max))
                }
            }
        } else {
            one_cycle(Communicator::init_from_env(cfg), c)
        };
        match res {
            Err(e) => die(&format!("{who}: {e}")),
            Ok(live) if c >= warmup => peak = peak.max(live).max(Usage::now()),
            Ok(_) => {}
        }
    }
    let end = settle(Usage::now(), Some(base));
    let secs = start.elapsed().as_secs_f64();
    let rss_growth_kib = end.rss_kib.saturating_sub(base.rss_kib);
    say(format!(
        "CYCLES {who}: {cycles} init/destroy cycles in {secs:.1} s ({:.1} ms/cycle); after {warmup} warm-up -> end (peak while live): fds {} -> {} ({}), threads {} -> {} ({}), shm names {} -> {} ({}), shm mappings {} -> {} ({}), RSS {} -> {} KiB ({} KiB), growth {} KiB (bound {} MiB)",
        secs * 1e3 / cycles.max(1) as f64,
        base.fds,
        end.fds,
        peak.fds,
        base.threads,
        end.threads,
        peak.threads,
        base.shm,
        end.shm,
        peak.shm,
        base.shm_maps,
        end.shm_maps,
        peak.shm_maps,
        base.rss_kib,
        end.rss_kib,
        peak.rss_kib,
        rss_growth_kib,
        rss_bound_mib
    ));
    let mut bad = Vec::new();
    if end.fds > base.fds {
        bad.push(format!("file descriptors grew {} -> {}", base.fds, end.fds));
    }
    if end.threads > base.threads {
        bad.push(format!("threads grew {} -> {}", base.threads, end.threads));
    }
    if end.shm > base.shm {
        bad.push(format!(
            "shm segment names grew {} -> {}",
            base.shm, end.shm
        ));
    }
    if end.shm_maps > base.shm_maps {
        bad.push(format!(
            "shm segment mappings grew {} -> {}",
            base.shm_maps, end.shm_maps
        ));
    }
    if rss_growth_kib > rss_bound_mib * 1024 {
        bad.push(format!(
            "RSS grew {rss_growth_kib} KiB > {rss_bound_mib} MiB"
        ));
    }
    if bad.is_empty() {
        0
    } else {
        say(format!("LEAK {who}: {}", bad.join("; ")));
        1
    }
}

/// Lets background threads of the last communicator finish (the root's
/// monitor ends when every rank left): samples for up to 3 s until fds,
/// threads and segments are back to `target` (or stop changing).
fn settle(mut u: Usage, target: Option<Usage>) -> Usage {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let v = Usage::now();
        let done = match target {
            Some(t) => {
                v.fds <= t.fds
                    && v.threads <= t.threads
                    && v.shm <= t.shm
                    && v.shm_maps <= t.shm_maps
            }
            None => {
                v.fds == u.fds
                    && v.threads == u.threads
                    && v.shm == u.shm
                    && v.shm_maps == u.shm_maps
            }
        };
        u = v;
        if done || Instant::now() > deadline {
            return u;
        }
    }
}
