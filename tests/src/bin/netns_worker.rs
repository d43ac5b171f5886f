//! One rank (or the attacker) of the network-namespace fault tests, started
//! by `scripts/netns/run.sh` in its own namespace with torchrun-style
//! variables. `NETNS_MODE` selects what it does:
//!
//! - `matrix`: a seeded sample of the exact-checked case matrix (`cases`):
//!   `NETNS_CASES` small cases plus `NETNS_LARGE` large ones (run under
//!   random packet loss: results must be exact);
//! - `big`: 64 MiB in-place all-reduces in a loop for up to
//!   `NETNS_BIG_SECS` seconds, each checked, so that the runner can kill a
//!   rank or take a link down in the middle of one;
//! - `mismatch`: rank `FAULT_RANK` calls broadcast where the others call
//!   all_reduce, as operation #3;
//! - `garbage`: `NETNS_ROUNDS` communicators one after the other (the first
//!   from the environment, without a secret; the others from a unique id
//!   with a secret that rank 0 writes to `NETNS_ID_DIR`), each running
//!   `NETNS_CASES` exact-checked cases, while the attacker runs;
//! - `attack`: not a rank; runs in a namespace of its own on the bridge.
//!   Watches the TCP sockets of the namespaces of the processes in
//!   `NETNS_ATTACK_PIDS` (their `/proc/PID/net/tcp`, what `ss -tan` shows
//!   there; one pid per rank's namespace, in rank order, `NETNS_ATTACK_IPS`
//!   their addresses) and the fixed targets in `NETNS_ATTACK_TARGETS`, and
//!   sends every listening port it sees random bytes, a hello with a wrong
//!   secret, a transport greeting with a wrong nonce, oversized and
//!   truncated frames, idle connections, HTTP and slowloris trickles
//!   (`NETNS_ATTACK_HERD` at once per new port), until the file
//!   `NETNS_ATTACK_STOP` exists. To keep the job's ports open long enough
//!   to be hit, one `garbage` rank in turn joins `NETNS_JOIN_DELAY_MS` late
//!   (the root's port stays open meanwhile; the runner also drops the
//!   first SYN of every connection between ranks, so that each connect
//!   takes a 1 s retransmit with the listeners open). Optionally
//!   (`NETNS_ATTACK_ROOT_FREEZE_MS` > 0) the attacker also plays a slow
//!   rank 0 (SIGSTOP / SIGCONT) when a new bootstrap root listens: ranks
//!   and strays pile up in the root's accept queue, as behind a busy root,
//!   and another herd of strays arrives just before it resumes.
//!
//! With `NETNS_START_DELAY_MS`, ranks other than 0 start that late.
//!
//! Ranks print machine-readable lines on stdout:
//! `PID <rank> <pid>`, `PHASE <rank> <epoch ms>` (the big loop started),
//! `CASES <rank> <cases> <failed cases>` and
//! `RESULT <rank> ok|err <ms since the phase started> <epoch ms> <error>`.
//! The exit code is 0 when every case was exact (or the mode ends in an
//! expected error), 1 on a wrong result, 2 on an unexpected error.

use nccl_rs::{Communicator, Config, RedOp, UniqueId};
use nccl_tests_suite::cases::{matrix, run, select, Case};
use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

fn env_num<T: std::str::FromStr>(k: &str, default: T) -> T {
    env(k).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() {
    nccl_rs::init_logging();
    let mode = env("NETNS_MODE").unwrap_or_else(|| "matrix".into());
    if mode == "attack" {
        attack::main();
        return;
    }
    let rank_env: usize = env_num("RANK", 0);
    say(format!("PID {rank_env} {}", std::process::id()));
    let cfg = Config::from_env().unwrap_or_else(|e| fail(rank_env, &format!("config: {e}")));
    // NETNS_START_DELAY_MS: ranks other than 0 start late (rank 0 and its
    // root are up, alone, meanwhile).
    if rank_env != 0 {
        std::thread::sleep(Duration::from_millis(env_num("NETNS_START_DELAY_MS", 0)));
    }
    let code = match mode.as_str() {
        "matrix" => {
            let mut comm = init_env(&cfg, rank_env);
            let cases = sample(comm.size());
            let code = run_cases(&mut comm, &cases, env_num("NCCL_RS_TEST_SEED", 1));
            drop(comm);
            code
        }
        "big" => big(&cfg, rank_env),
        "mismatch" => mismatch(&cfg, rank_env),
        "garbage" => garbage(&cfg, rank_env),
        other => fail(rank_env, &format!("unknown NETNS_MODE {other:?}")),
    };
    std::process::exit(code);
}

fn fail(rank: usize, msg: &str) -> ! {
    say(format!("RESULT {rank} err 0 {} {msg}", epoch_ms()));
    std::process::exit(2)
}

fn init_env(cfg: &Config, rank: usize) -> Communicator {
    Communicator::init_from_env(cfg).unwrap_or_else(|e| fail(rank, &format!("init: {e}")))
}

/// The seeded sample: `NETNS_CASES` of the small cases and `NETNS_LARGE`
/// of the large ones, in matrix order (identical on every rank).
fn sample(n: usize) -> Vec<Case> {
    let seed: u64 = env_num("NCCL_RS_TEST_SEED", 1);
    let small_n: usize = env_num("NETNS_CASES", 120);
    let large_n: usize = env_num("NETNS_LARGE", 3);
    let all = select(&matrix(n), seed, true, 1);
    let key = |i: usize| {
        (i as u64 ^ seed.wrapping_mul(0xA24B_AED4_963E_E407))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(23)
    };
    let mut small: Vec<usize> = (0..all.len()).filter(|&i| all[i].count < 100_000).collect();
    let mut large: Vec<usize> = (0..all.len())
        .filter(|&i| all[i].count >= 100_000)
        .collect();
    small.sort_by_key(|&i| key(i));
    large.sort_by_key(|&i| key(i));
    let mut keep: Vec<usize> = small
        .into_iter()
        .take(small_n)
        .chain(large.into_iter().take(large_n))
        .collect();
    keep.sort_unstable();
    keep.into_iter().map(|i| all[i]).collect()
}

/// Runs `cases`, prints `CASES` and `RESULT`; returns the exit code.
fn run_cases(comm: &mut Communicator, cases: &[Case], seed: u64) -> i32 {
    let rank = comm.rank();
    let start = Instant::now();
    let mut failed = 0;
    for (i, case) in cases.iter().enumerate() {
        match run(comm, case, seed.wrapping_add(i as u64)) {
            Ok(0) => {}
            Ok(wrong) => {
                failed += 1;
                say(format!(
                    "WRONG {rank} case {i} {case:?}: {wrong} wrong elements"
                ));
            }
            Err(e) => {
                say(format!("CASES {rank} {i} {failed}"));
                say(format!(
                    "RESULT {rank} err {} {} case {i} {case:?}: {e}",
                    start.elapsed().as_millis(),
                    epoch_ms()
                ));
                return 2;
            }
        }
    }
    say(format!("CASES {rank} {} {failed}", cases.len()));
    say(format!(
        "RESULT {rank} ok {} {}",
        start.elapsed().as_millis(),
        epoch_ms()
    ));
    if failed == 0 {
        0
    } else {
        1
    }
}

/// 64 MiB in-place all-reduces (f32, sum), each checked, until an error
/// or `NETNS_BIG_SECS` pass. An error is the expected outcome.
fn big(cfg: &Config, rank_env: usize) -> i32 {
    let mut comm = init_env(cfg, rank_env);
    let (rank, n) = (comm.rank(), comm.size());
    let secs: u64 = env_num("NETNS_BIG_SECS", 30);
    let mut buf = vec![0f32; 16 << 20];
    let want = (n * (n + 1) / 2) as f32;
    // Warm up (connections, buffers) with one full-size call.
    buf.fill((rank + 1) as f32);
    if let Err(e) = comm.all_reduce_in_place(&mut buf, RedOp::Sum) {
        fail(rank, &format!("warm-up: {e}"));
    }
    let start = Instant::now();
    say(format!("PHASE {rank} {}", epoch_ms()));
    let mut calls = 0u64;
    let res = loop {
        buf.fill((rank + 1) as f32);
        if let Err(e) = comm.all_reduce_in_place(&mut buf, RedOp::Sum) {
            break Err(e);
        }
        calls += 1;
        if let Some(i) = buf.iter().position(|&x| x != want) {
            say(format!(
                "WRONG {rank} call {calls}: element {i} is {} not {want}",
                buf[i]
            ));
            return 1;
        }
        if start.elapsed() > Duration::from_secs(secs) {
            break Ok(());
        }
    };
    let ms = start.elapsed().as_millis();
    match res {
        Ok(()) => say(format!(
            "RESULT {rank} ok {ms} {} {calls} calls",
            epoch_ms()
        )),
        Err(e) => say(format!(
            "RESULT {rank} err {ms} {} after {calls} calls: {e}",
            epoch_ms()
        )),
    }
    let t = Instant::now();
    drop(comm);
    say(format!("DROPPED {rank} {}", t.elapsed().as_millis()));
    0
}

/// Rank `FAULT_RANK` calls broadcast as operation #3 where the others call
/// all_reduce: every rank must fail with a message naming the calls.
fn mismatch(cfg: &Config, rank_env: usize) -> i32 {
    let bad: usize = env_num("FAULT_RANK", 1);
    let mut comm = init_env(cfg, rank_env);
    let rank = comm.rank();
    let mut small = vec![1.0f32; 1024];
    for _ in 0..2 {
        if let Err(e) = comm.all_reduce_in_place(&mut small, RedOp::Sum) {
            fail(rank, &format!("warm-up: {e}"));
        }
    }
    let start = Instant::now();
    let res = if rank == bad {
        comm.broadcast_in_place(&mut small, 0)
    } else {
        comm.all_reduce_in_place(&mut small, RedOp::Sum)
    };
    let ms = start.elapsed().as_millis();
    match res {
        Ok(()) => say(format!("RESULT {rank} ok {ms} {}", epoch_ms())),
        Err(e) => say(format!("RESULT {rank} err {ms} {} {e}", epoch_ms())),
    }
    drop(comm);
    0
}

/// Several communicators in a row, each running exact-checked cases, while
/// strangers hammer every listening port.
fn garbage(cfg: &Config, rank_env: usize) -> i32 {
    let rounds: usize = env_num("NETNS_ROUNDS", 4);
    let dir = std::path::PathBuf::from(env("NETNS_ID_DIR").unwrap_or_else(|| "/tmp".into()));
    let n: usize = env_num("WORLD_SIZE", 1);
    let cases = sample(n);
    let mut total = 0;
    let mut failed_cases = 0;
    let start = Instant::now();
    let delay = Duration::from_millis(env_num("NETNS_JOIN_DELAY_MS", 0));
    for round in 0..rounds {
        // One rank (3, 1, 2, 3, ... at 4 ranks) comes late: the root's port
        // stays open meanwhile.
        if n > 1 && rank_env == 1 + (round + n - 2) % (n - 1) {
            std::thread::sleep(delay);
        }
        let mut comm = if round == 0 {
            init_env(cfg, rank_env)
        } else {
            let file = dir.join(format!("id.{round}"));
            let id = if rank_env == 0 {
                let id = UniqueId::new(cfg)
                    .unwrap_or_else(|e| fail(rank_env, &format!("round {round}: unique id: {e}")));
                let tmp = dir.join(format!("id.{round}.tmp"));
                std::fs::write(&tmp, id.to_hex())
                    .and_then(|_| std::fs::rename(&tmp, &file))
                    .unwrap_or_else(|e| fail(rank_env, &format!("write {file:?}: {e}")));
                id
            } else {
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    if let Ok(hex) = std::fs::read_to_string(&file) {
                        break UniqueId::from_hex(hex.trim())
                            .unwrap_or_else(|e| fail(rank_env, &format!("read {file:?}: {e}")));
                    }
                    if Instant::now() > deadline {
                        fail(
                            rank_env,
                            &format!("round {round}: no unique id in {file:?}"),
                        );
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            };
            Communicator::init(&id, n, rank_env, cfg)
                .unwrap_or_else(|e| fail(rank_env, &format!("round {round}: init: {e}")))
        };
        let rank = comm.rank();
        for (i, case) in cases.iter().enumerate() {
            total += 1;
            match run(&mut comm, case, (round * 1000 + i) as u64) {
                Ok(0) => {}
                Ok(wrong) => {
                    failed_cases += 1;
                    say(format!(
                        "WRONG {rank} round {round} case {i} {case:?}: {wrong} wrong elements"
                    ));
                }
                Err(e) => {
                    say(format!("CASES {rank} {total} {failed_cases}"));
                    fail(rank, &format!("round {round} case {i} {case:?}: {e}"));
                }
            }
        }
        drop(comm);
    }
    say(format!("CASES {rank_env} {total} {failed_cases}"));
    say(format!(
        "RESULT {rank_env} ok {} {} {rounds} communicators",
        start.elapsed().as_millis(),
        epoch_ms()
    ));
    if failed_cases == 0 {
        0
    } else {
        1
    }
}

/// The stranger: connects to every listening port of the job and misbehaves.
mod attack {
    use super::{env, env_num, say};
    use std::collections::{BTreeMap, BTreeSet};
    use std::io::Write;
    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// The kinds of misbehaviour, in the order of the counters.
    const KINDS: [&str; 8] = [
        "random",
        "bad-secret-hello",
        "bad-nonce-greeting",
        "oversized",
        "truncated",
        "idle",
        "http",
        "slowloris",
    ];

    /// Set when the attack ends: slowloris threads stop trickling.
    static STOP: AtomicBool = AtomicBool::new(false);

    /// A tiny xorshift generator (no dependency; quality is irrelevant).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn seed() -> u64 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        (t ^ (std::process::id() as u64) << 32) | 1
    }

    /// A TCP socket of a namespace, from `/proc/PID/net/tcp`.
    struct Sock {
        local: SocketAddrV4,
        listen: bool,
    }

    /// The IPv4 TCP sockets in the namespace of `pid` (what `ss -tan` shows
    /// there); an unspecified local address reads as `ns_ip`.
    fn sockets(pid: &str, ns_ip: Ipv4Addr) -> Vec<Sock> {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
            return Vec::new();
        };
        let addr = |s: &str| -> Option<SocketAddrV4> {
            let (ip, port) = s.split_once(':')?;
            let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_le_bytes());
            Some(SocketAddrV4::new(ip, u16::from_str_radix(port, 16).ok()?))
        };
        text.lines()
            .skip(1)
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let mut local = addr(f.nth(1)?)?;
                let state = f.nth(1)?;
                if local.ip().is_unspecified() {
                    local.set_ip(ns_ip);
                }
                Some(Sock {
                    local,
                    listen: state == "0A",
                })
            })
            .filter(|s| !s.local.ip().is_loopback())
            .collect()
    }

    /// The byte pattern of attack `kind`.
    fn payload(kind: usize, rng: &mut Rng) -> Vec<u8> {
        match kind {
            0 => {
                let n = 1 + (rng.next() % 4096) as usize;
                rng.bytes(n)
            }
            1 => {
                // A well-formed bootstrap hello with a random secret.
                let mut b = 32u32.to_le_bytes().to_vec();
                b.extend_from_slice(b"NCRH");
                b.extend_from_slice(&1u32.to_le_bytes());
                b.extend(rng.bytes(16));
                b.extend_from_slice(&((rng.next() % 4) as u32).to_le_bytes());
                b.extend_from_slice(&4u32.to_le_bytes());
                b
            }
            2 => {
                // A TCP transport greeting with a random nonce.
                let mut b = b"NTCP\x01\0\0\0".to_vec();
                b.extend(rng.bytes(8));
                b
            }
            3 => {
                let mut b = [0xffu8, 0xff, 0xff, 0xff].to_vec();
                b.extend(rng.bytes(64));
                b
            }
            4 => {
                // A frame that promises 32 bytes and delivers 10.
                let mut b = 32u32.to_le_bytes().to_vec();
                b.extend_from_slice(b"NCRH");
                b.extend(rng.bytes(6));
                b
            }
            5 => Vec::new(),
            _ => b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        }
    }

    /// One connection of `kind` to `to`; true if it connected.
    fn hit(to: SocketAddr, kind: usize, rng: &mut Rng) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&to, Duration::from_millis(300)) else {
            return false;
        };
        let _ = s.set_write_timeout(Some(Duration::from_millis(300)));
        let _ = s.write_all(&payload(kind, rng));
        if kind == 5 {
            std::thread::sleep(Duration::from_millis(200));
        }
        true
    }

    /// A slowloris: a valid-looking hello prefix, one byte every 400 ms,
    /// for up to `hold`.
    fn trickle(to: SocketAddr, hold: Duration) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&to, Duration::from_millis(300)) else {
            return false;
        };
        let _ = s.set_write_timeout(Some(Duration::from_millis(300)));
        let mut msg = 32u32.to_le_bytes().to_vec();
        msg.extend_from_slice(b"NCRH\x01\0\0\0");
        msg.extend_from_slice(&[0x5a; 24]);
        let start = Instant::now();
        for b in msg {
            if STOP.load(Ordering::Relaxed) || start.elapsed() > hold || s.write_all(&[b]).is_err()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(400));
        }
        true
    }

    /// The network namespace of `pid` (`net:[inode]`).
    fn netns_of(pid: &str) -> Option<std::path::PathBuf> {
        std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
    }

    /// Other `netns_worker` processes in the namespace of `anchor`.
    fn ranks_in_netns_of(anchor: &str) -> Vec<String> {
        let Some(ns) = netns_of(anchor) else {
            return Vec::new();
        };
        let me = std::process::id().to_string();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()) && *p != me)
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "netns_worker")
            })
            .filter(|p| netns_of(p).as_ref() == Some(&ns))
            .collect()
    }

    /// Sends `sig` to `pid`.
    fn signal(pid: i32, sig: i32) {
        extern "C" {
            fn kill(pid: i32, sig: i32) -> i32;
        }
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        unsafe {
            kill(pid, sig);
        }
    }

    const SIGCONT: i32 = 18;
    const SIGSTOP: i32 = 19;

    /// Stops ranks (SIGSTOP) for a while, one freeze at a time; knows the
    /// rank processes of each namespace ahead of time, so that a freeze
    /// lands within microseconds of the decision.
    struct Freezer {
        anchors: Vec<String>,
        ranks: Vec<Vec<i32>>,
        refreshed: Instant,
        busy: Arc<AtomicBool>,
        done: Arc<AtomicU64>,
        start: Instant,
    }

    impl Freezer {
        /// Re-reads which processes are ranks: every 100 ms until every
        /// namespace has one, then every 2 s (ranks live for the whole run).
        fn refresh(&mut self) {
            let every = if self.ranks.len() == self.anchors.len()
                && self.ranks.iter().all(|r| !r.is_empty())
            {
                2000
            } else {
                100
            };
            if self.refreshed.elapsed() > Duration::from_millis(every) || self.ranks.is_empty() {
                self.ranks = self
                    .anchors
                    .iter()
                    .map(|a| {
                        ranks_in_netns_of(a)
                            .iter()
                            .filter_map(|p| p.parse().ok())
                            .collect()
                    })
                    .collect();
                self.refreshed = Instant::now();
            }
        }

        /// Stops namespace `ns`'s rank for `how_long`; runs `before_thaw`
        /// (in the freezer's thread) just before it continues.
        fn freeze(
            &self,
            ns: usize,
            how_long: Duration,
            why: &str,
            before_thaw: impl FnOnce() + Send + 'static,
        ) -> Option<std::thread::JoinHandle<()>> {
            let pids = self.ranks.get(ns).filter(|p| !p.is_empty())?.clone();
            if how_long.is_zero() || self.busy.swap(true, Ordering::SeqCst) {
                return None;
            }
            for &p in &pids {
                signal(p, SIGSTOP);
            }
            eprintln!(
                "{:>7} ms: froze rank {ns} (pid {pids:?}) for {how_long:?}: {why}",
                self.start.elapsed().as_millis()
            );
            let (busy, done) = (self.busy.clone(), self.done.clone());
            Some(std::thread::spawn(move || {
                std::thread::sleep(how_long);
                before_thaw();
                for &p in &pids {
                    signal(p, SIGCONT);
                }
                done.fetch_add(1, Ordering::Relaxed);
                busy.store(false, Ordering::SeqCst);
            }))
        }
    }

    pub(super) fn main() {
        let list = |k: &str| -> Vec<String> {
            env(k)
                .unwrap_or_default()
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        };
        let pids = list("NETNS_ATTACK_PIDS");
        let ips: Vec<Ipv4Addr> = list("NETNS_ATTACK_IPS")
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect();
        let fixed: Vec<SocketAddr> = list("NETNS_ATTACK_TARGETS")
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect();
        let stop = env("NETNS_ATTACK_STOP").unwrap_or_else(|| "/nonexistent".into());
        let max = Duration::from_secs(env_num("NETNS_ATTACK_SECS", 120));
        let herd: usize = env_num("NETNS_ATTACK_HERD", 80);
        let freeze_root = Duration::from_millis(env_num("NETNS_ATTACK_ROOT_FREEZE_MS", 0));
        let counts: Arc<Vec<AtomicU64>> =
            Arc::new(KINDS.iter().map(|_| AtomicU64::new(0)).collect());
        let live = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut freezer = Freezer {
            anchors: pids.clone(),
            ranks: Vec::new(),
            refreshed: start,
            busy: Arc::new(AtomicBool::new(false)),
            done: Arc::new(AtomicU64::new(0)),
            start,
        };
        let mut seen: BTreeMap<SocketAddr, Instant> = BTreeMap::new();
        let mut attacked: BTreeSet<SocketAddr> = BTreeSet::new();
        // The latest bootstrap root.
        let mut last_root: Option<SocketAddrV4> = None;
        let mut rng = Rng(seed());
        let mut workers: Vec<std::thread::JoinHandle<()>> = Vec::new();
        while start.elapsed() < max && !std::path::Path::new(&stop).exists() {
            freezer.refresh();
            let socks: Vec<Vec<Sock>> = pids
                .iter()
                .enumerate()
                .map(|(i, p)| sockets(p, ips.get(i).copied().unwrap_or(Ipv4Addr::UNSPECIFIED)))
                .collect();
            let listeners: Vec<SocketAddrV4> = socks
                .iter()
                .flatten()
                .filter(|s| s.listen)
                .map(|s| s.local)
                .collect();
            let ns0: Vec<SocketAddrV4> = socks
                .first()
                .map(|v| v.iter().filter(|s| s.listen).map(|s| s.local).collect())
                .unwrap_or_default();
            // The bootstrap root appears alone in rank 0's namespace: freeze
            // rank 0 (its root thread with it) a moment, so that strays and
            // ranks pile up in its accept queue, as behind a busy root.
            // Just before it thaws, a herd of strays joins the queue: the
            // root then finds ranks that connected during the stall ahead
            // of `herd` strangers.
            if let [root] = ns0[..] {
                if !attacked.contains(&SocketAddr::V4(root)) && last_root != Some(root) {
                    last_root = Some(root);
                    let (counts, to) = (counts.clone(), SocketAddr::V4(root));
                    let late_herd = move || {
                        let hs: Vec<_> = (0..herd)
                            .map(|_| {
                                let counts = counts.clone();
                                std::thread::spawn(move || {
                                    if trickle(to, Duration::from_secs(3)) {
                                        counts[7].fetch_add(1, Ordering::Relaxed);
                                    }
                                })
                            })
                            .collect();
                        std::thread::sleep(Duration::from_millis(100));
                        // The trickles go on after the thaw; joined here.
                        std::thread::spawn(move || hs.into_iter().for_each(|h| drop(h.join())));
                    };
                    workers.extend(freezer.freeze(
                        0,
                        freeze_root,
                        &format!("new bootstrap root {root}"),
                        late_herd,
                    ));
                }
            }
            // (address, seen listening): fixed targets are hit whether or
            // not they listen yet; the slowloris herd only goes to ports
            // seen listening.
            let mut now: Vec<(SocketAddr, bool)> = listeners
                .iter()
                .map(|&a| (SocketAddr::V4(a), true))
                .collect();
            now.extend(fixed.iter().map(|&a| (a, false)));
            now.dedup_by_key(|(a, _)| *a);
            for (to, listed) in now {
                // A new port gets a burst of every kind and a slowloris
                // herd at once; a port still listening, a burst every 100 ms.
                if seen
                    .get(&to)
                    .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
                {
                    continue;
                }
                seen.insert(to, Instant::now());
                if live.load(Ordering::Relaxed) > 1500 {
                    continue;
                }
                let first = listed && attacked.insert(to);
                if first {
                    eprintln!("{:>7} ms: new listener {to}", start.elapsed().as_millis());
                }
                let (counts, live) = (counts.clone(), live.clone());
                let mut r = Rng(rng.next() | 1);
                live.fetch_add(1, Ordering::Relaxed);
                workers.push(std::thread::spawn(move || {
                    let mut herd_threads = Vec::new();
                    if first {
                        for _ in 0..herd {
                            let (counts, live) = (counts.clone(), live.clone());
                            live.fetch_add(1, Ordering::Relaxed);
                            herd_threads.push(std::thread::spawn(move || {
                                if trickle(to, Duration::from_secs(8)) {
                                    counts[7].fetch_add(1, Ordering::Relaxed);
                                }
                                live.fetch_sub(1, Ordering::Relaxed);
                            }));
                        }
                    }
                    for kind in 0..7 {
                        if hit(to, kind, &mut r) {
                            counts[kind].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    for h in herd_threads {
                        let _ = h.join();
                    }
                    live.fetch_sub(1, Ordering::Relaxed);
                }));
            }
            workers.retain(|h| !h.is_finished());
            std::thread::sleep(Duration::from_millis(1));
        }
        STOP.store(true, Ordering::Relaxed);
        for w in workers {
            let _ = w.join();
        }
        let total: u64 = counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        let per: Vec<String> = KINDS
            .iter()
            .zip(counts.iter())
            .map(|(k, c)| format!("{k}={}", c.load(Ordering::Relaxed)))
            .collect();
        let ports: Vec<String> = attacked.iter().map(|a| a.to_string()).collect();
        let frozen = freezer.done.load(Ordering::Relaxed);
        say(format!(
            "ATTACK connections={total} ports={} freezes={frozen} {} targets={}",
            attacked.len(),
            per.join(" "),
            ports.join(",")
        ));
    }
}
