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
        if STOP.load(Ordering::Relaxed) || start.elapsed() > hold || s.write_all(&[b]).is_err() {
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
        let every =
            if self.ranks.len() == self.anchors.len() && self.ranks.iter().all(|r| !r.is_empty()) {
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
    let counts: Arc<Vec<AtomicU64>> = Arc::new(KINDS.iter().map(|_| AtomicU64::new(0)).collect());
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
