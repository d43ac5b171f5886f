//! The floors under shared-memory collectives on this host: how long one
//! core takes to copy a message with `memcpy` (a rank's local block, the
//! zero-copy path) and with `process_vm_readv` from another process (the
//! single-copy path on heap buffers).
//!
//! ```text
//! copy_floor [-b 64K] [-e 64M] [-f 4] [-n 0] [-d 0] [--thp]
//! ```
//! `-n 0` picks the repetitions per size (about 50 ms of copying). Each
//! cell is the median over repetitions. `-d D` puts every destination `D`
//! bytes after its source modulo 4096 (0 to 4095): both copies use
//! `rep movsb`, which on AMD Zen runs several times slower at distances of
//! 1 to 15 (`copy_floor -d 4` against `-d 0` shows whether a host's CPU
//! does; nccl-rs keeps its own copies off those distances). `--thp` asks
//! for transparent huge pages (`MADV_HUGEPAGE`) under every buffer, the
//! source process's too, and says how much of each it got: the kernel pins
//! each page `process_vm_readv` reads, and a 2 MiB page costs one pin
//! where 4 KiB pages cost 512.
//!
//! `copy_floor --pair [A B]` instead times a cache-line round trip between
//! two CPUs (default the first two this process may run on): one number
//! in ns, the median of 20 bursts. On a virtual machine it tells where the
//! host put the two vCPUs right now: tens of ns while they share a core or
//! a cache, hundreds while they do not. Some hosts move them between the two
//! within seconds, and every copy between two ranks' cores moves with it. The source buffer lives in a child
//! process (this program run as `copy_floor --serve <bytes>`), which fills
//! it once and waits for its standard input to close. For both cores busy,
//! as two ranks of an all-gather are, run two at once
//! (`copy_floor & copy_floor; wait`).

use nccl_perf::args::{size_arg as size, Sweep};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

struct Args {
    sweep: Sweep,
    /// Destination minus source, modulo 4096.
    distance: usize,
    /// Buffers in transparent huge pages where the kernel allows.
    thp: bool,
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        sweep: Sweep {
            min: 64 << 10,
            max: 64 << 20,
            factor: 4,
            reps: 0,
        },
        distance: 0,
        thp: false,
    };
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            f if a.sweep.take(f, &mut value)? => {}
            "-d" => a.distance = size(&value()?)?,
            "--thp" => a.thp = true,
            "-h" | "--help" => return Err(
                "usage: copy_floor [-b min] [-e max] [-f factor] [-n reps] [-d distance] [--thp]"
                    .into(),
            ),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    a.sweep.check()?;
    if a.distance >= 4096 {
        return Err(format!("-d {}: a distance is 0 to 4095", a.distance));
    }
    Ok(a)
}

/// A huge page (x86-64's PMD size).
const HUGE: usize = 2 << 20;

/// A buffer of `bytes` bytes filled by `fill`, as a vector and the offset
/// where it starts in it: with `thp`, at a 2 MiB boundary, its pages
/// advised `MADV_HUGEPAGE` before they are first touched.
fn buffer(bytes: usize, thp: bool, fill: impl Fn(usize) -> u8) -> (Vec<u8>, usize) {
    if !thp {
        return ((0..bytes).map(fill).collect(), 0);
    }
    let mut v: Vec<u8> = Vec::with_capacity(bytes + HUGE);
    let at = v.as_ptr().align_offset(HUGE);
    // SAFETY: madvise only changes how the kernel backs the range (no
    // mapping is created or removed); the range lies within `v`'s
    // allocation (`at < HUGE`, `at + bytes <= capacity`) and starts on a
    // page boundary. A refusal leaves ordinary pages, which is reported.
    unsafe {
        libc::madvise(v.as_mut_ptr().add(at).cast(), bytes, libc::MADV_HUGEPAGE);
    }
    v.resize(at, 0);
    v.extend((0..bytes).map(fill));
    (v, at)
}

/// kB of process `pid`'s anonymous memory in huge pages, from
/// `/proc/PID/smaps_rollup`.
fn huge_kb(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("AnonHugePages:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .unwrap_or_else(|| "?".into())
}

/// The child: fills a buffer, prints `pid address`, waits for stdin to close.
fn serve(bytes: usize, thp: bool) -> Result<(), String> {
    let (buf, at) = buffer(bytes, thp, |i| (i % 251) as u8);
    println!("{} {}", std::process::id(), buf.as_ptr() as usize + at);
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut sink = String::new();
    while std::io::stdin()
        .read_line(&mut sink)
        .map_err(|e| e.to_string())?
        > 0
    {}
    drop(buf);
    Ok(())
}

/// Copies `dst.len()` bytes from address `src` of process `pid`.
fn cma_read(pid: i32, src: usize, dst: &mut [u8]) -> Result<(), String> {
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: src as *mut libc::c_void,
        iov_len: dst.len(),
    };
    // SAFETY: `local` describes `dst`, which this call borrows mutably; the
    // kernel checks `remote` against the child's address space (the child
    // keeps its buffer until we close its stdin) and writes at most
    // `dst.len()` bytes into `dst`.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    match n {
        n if n == dst.len() as isize => Ok(()),
        n if n < 0 => Err(format!(
            "process_vm_readv: {}",
            std::io::Error::last_os_error()
        )),
        n => Err(format!("process_vm_readv: short read of {n} bytes")),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median over `reps` runs of `op`, in seconds.
fn timed(reps: usize, mut op: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        op()?;
        times.push(start.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

/// A source process: its pid and buffer address, and its stdin, whose
/// closing ends it.
struct Source {
    child: std::process::Child,
    pid: i32,
    addr: usize,
}

fn spawn_source(bytes: usize, thp: bool) -> Result<Source, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["--serve", &bytes.to_string()])
        .args(thp.then_some("--thp"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting a source process: {e}"))?;
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let mut words = line.split_whitespace().map(str::parse::<usize>);
    let (Some(Ok(pid)), Some(Ok(addr))) = (words.next(), words.next()) else {
        return Err(format!("a source process said {line:?}"));
    };
    let pid = i32::try_from(pid).map_err(|e| e.to_string())?;
    Ok(Source { child, pid, addr })
}

impl Drop for Source {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Where in `buf` (at least 4096 bytes longer than needed) a range starts
/// that lies `distance` bytes after `src` modulo 4096.
fn at_distance(buf: &[u8], src: usize, distance: usize) -> usize {
    (src + distance + 4096 - buf.as_ptr() as usize % 4096) % 4096
}

fn run(a: &Args) -> Result<(), String> {
    let source = spawn_source(a.sweep.max, a.thp)?;
    let (src, s0) = buffer(a.sweep.max, a.thp, |i| (i % 251) as u8);
    let src = &src[s0..];
    let (mut buf, b0) = buffer(a.sweep.max + 4096, a.thp, |_| 0);
    let buf = &mut buf[b0..];
    // The destination of the local copy, and of the child's buffer (whose
    // address the child told us).
    let local = at_distance(buf, src.as_ptr() as usize, a.distance);
    let remote = at_distance(buf, source.addr, a.distance);
    println!(
        "# copy_floor: one core copying; median of repetitions; destination {} bytes after the source modulo 4096",
        a.distance
    );
    if a.thp {
        println!(
            "# --thp: {} kB of this process's and {} kB of the source process's memory in huge pages",
            huge_kb(std::process::id()),
            huge_kb(source.pid as u32)
        );
    }
    println!(
        "# {:>10} {:>12} {:>9} {:>12} {:>9} {:>8}",
        "size", "memcpy(us)", "GB/s", "cma(us)", "GB/s", "cma/cpy"
    );
    for bytes in a.sweep.sizes() {
        let reps = match a.sweep.reps {
            0 => (50_000_000 / bytes.max(1)).clamp(5, 20_000),
            n => n,
        };
        let memcpy = timed(reps, || {
            buf[local..local + bytes].copy_from_slice(&src[..bytes]);
            Ok(())
        })?;
        let cma = timed(reps, || {
            cma_read(source.pid, source.addr, &mut buf[remote..remote + bytes])
        })?;
        let gbs = |s: f64| bytes as f64 / s / 1e9;
        println!(
            "  {:>10} {:>12.2} {:>9.2} {:>12.2} {:>9.2} {:>8.2}",
            bytes,
            memcpy * 1e6,
            gbs(memcpy),
            cma * 1e6,
            gbs(cma),
            cma / memcpy
        );
    }
    drop(source);
    Ok(())
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> Result<(), String> {
    let set = nccl_perf::bind::single_cpu_set(cpu);
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is this thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    match r {
        0 => Ok(()),
        _ => Err(format!("cpu {cpu}: {}", std::io::Error::last_os_error())),
    }
}

/// A word on a cache line of its own.
#[repr(align(128))]
struct Line(AtomicU64);

/// Median ns of a round trip of one cache line between CPUs `a` and `b`:
/// this thread on `a` writes odd values, a helper on `b` answers with the
/// next even one. Either side gives up (and makes the other stop) when
/// pinning fails or the other is silent for [`PAIR_DEADLINE`].
fn pair(a: usize, b: usize) -> Result<f64, String> {
    const TRIPS: u64 = 20_000;
    const BURSTS: u64 = 20;
    let line = Line(AtomicU64::new(0));
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Waits until `word` holds `want`; false if told to stop, or after
    // PAIR_DEADLINE without it.
    let wait = |word: &AtomicU64, want: u64| {
        let mut spins = 0u32;
        let mut since = None;
        while word.load(Ordering::Acquire) != want {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 {
                let t0 = *since.get_or_insert_with(Instant::now);
                if stop.load(Ordering::Relaxed) || t0.elapsed() > PAIR_DEADLINE {
                    return false;
                }
            }
        }
        true
    };
    pin(a)?;
    std::thread::scope(|s| {
        let pong = s.spawn(|| -> Result<(), String> {
            let r = pin(b).and_then(|()| {
                for i in 0..BURSTS * TRIPS {
                    if !wait(&line.0, 2 * i + 1) {
                        return Err(format!("no word from CPU {a}"));
                    }
                    line.0.store(2 * i + 2, Ordering::Release);
                }
                Ok(())
            });
            stop.store(true, Ordering::Relaxed);
            r
        });
        let ping = (|| {
            let mut bursts = Vec::with_capacity(BURSTS as usize);
            for burst in 0..BURSTS {
                let start = Instant::now();
                for i in burst * TRIPS..(burst + 1) * TRIPS {
                    line.0.store(2 * i + 1, Ordering::Release);
                    if !wait(&line.0, 2 * i + 2) {
                        return Err(format!("no answer from CPU {b}"));
                    }
                }
                bursts.push(start.elapsed().as_secs_f64() * 1e9 / TRIPS as f64);
            }
            Ok(median(bursts))
        })();
        stop.store(true, Ordering::Relaxed);
        let pong = pong
            .join()
            .map_err(|_| "the other thread panicked".to_string());
        // This thread is pinned already, so a failure of the helper's (its
        // pinning, or silence) explains ours: it goes first.
        pong??;
        ping
    })
}

/// The longest `--pair` may wait for the other CPU.
const PAIR_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// `--pair [A B]`.
fn run_pair(argv: &[String]) -> Result<(), String> {
    let cpus = nccl_perf::bind::allowed_cpus();
    let (a, b) = match argv {
        [] if cpus.len() >= 2 => (cpus[0], cpus[1]),
        [] => return Err("--pair needs two CPUs to run on".into()),
        [a, b] => (
            a.parse().map_err(|_| format!("not a CPU: {a:?}"))?,
            b.parse().map_err(|_| format!("not a CPU: {b:?}"))?,
        ),
        _ => return Err("usage: copy_floor --pair [cpu cpu]".into()),
    };
    if a == b {
        return Err("--pair needs two different CPUs".into());
    }
    if let Some(c) = [a, b].into_iter().find(|c| !cpus.contains(c)) {
        return Err(format!("--pair: this process may not run on CPU {c}"));
    }
    println!("{:.0}", pair(a, b)?);
    Ok(())
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let res = match argv.first().map(String::as_str) {
        Some("--pair") => run_pair(&argv[1..]),
        Some("--serve") => argv
            .get(1)
            .ok_or_else(|| "--serve needs a size".to_string())
            .and_then(|s| size(s))
            .and_then(|s| serve(s, argv.get(2).is_some_and(|f| f == "--thp"))),
        _ => parse(&argv).and_then(|a| run(&a)),
    };
    if let Err(e) = res {
        // One write: a server it started may share the terminal.
        let line = format!("copy_floor: {e}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        std::process::exit(1);
    }
}
