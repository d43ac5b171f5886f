//! Starts N real processes of a test program, as `ncclrun` does, with a
//! deadline: on timeout every child is killed and the test fails.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The result of one rank's process.
#[derive(Debug)]
pub struct RankOutput {
    /// The rank.
    pub rank: usize,
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Captured stdout.
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(29500)
}

/// Where rank `r`'s `what` ("out", "err") of a launch on `port` is captured.
pub fn log_path(port: u16, r: usize, what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "nccl-rs-test-{}-{port}-{r}.{what}",
        std::process::id()
    ))
}

/// Starts rank `r` of `n` of `program args` with torchrun-style variables
/// for a root on `127.0.0.1:port`, plus `extra_env`; its stdout and stderr
/// go to [`log_path`].
pub fn spawn_rank(
    program: &str,
    args: &[&str],
    (r, n): (usize, usize),
    port: u16,
    extra_env: &[(&str, String)],
) -> Child {
    let out = std::fs::File::create(log_path(port, r, "out")).expect("create log");
    let err = std::fs::File::create(log_path(port, r, "err")).expect("create log");
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("LOCAL_RANK", r.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("NCCL_SOCKET_IFNAME", "lo")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn rank process")
}

/// Reads and removes rank `r`'s captured `what`.
pub fn take_log(port: u16, r: usize, what: &str) -> String {
    let p = log_path(port, r, what);
    let s = std::fs::read_to_string(&p).unwrap_or_default();
    let _ = std::fs::remove_file(p);
    s
}

/// Kills and reaps every child, then reads and removes the `n` ranks'
/// captured (stdout, stderr) of a launch on `port`.
pub fn kill_and_take_logs(children: &mut [Child], port: u16, n: usize) -> Vec<(String, String)> {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    (0..n)
        .map(|r| (take_log(port, r, "out"), take_log(port, r, "err")))
        .collect()
}

/// Runs `program args` as `n` ranks with torchrun-style variables plus
/// `extra_env`, and waits at most `deadline`. Panics on timeout after
/// killing every child.
pub fn run_ranks(
    program: &str,
    args: &[&str],
    n: usize,
    extra_env: &[(&str, String)],
    deadline: Duration,
) -> Vec<RankOutput> {
    let port = free_port();
    let log = |r: usize, what: &str| log_path(port, r, what);
    let mut children: Vec<Child> = (0..n)
        .map(|r| spawn_rank(program, args, (r, n), port, extra_env))
        .collect();
    let start = Instant::now();
    let mut codes: Vec<Option<Option<i32>>> = vec![None; n];
    while codes.iter().any(Option::is_none) {
        for (r, c) in children.iter_mut().enumerate() {
            if codes[r].is_none() {
                if let Ok(Some(status)) = c.try_wait() {
                    codes[r] = Some(status.code());
                }
            }
        }
        if start.elapsed() > deadline {
            for c in &mut children {
                let _ = c.kill();
                let _ = c.wait();
            }
            for r in 0..n {
                eprintln!(
                    "rank {r} stderr:\n{}",
                    std::fs::read_to_string(log(r, "err")).unwrap_or_default()
                );
            }
            panic!("{program} with {n} ranks did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (0..n)
        .map(|rank| RankOutput {
            rank,
            code: codes[rank].flatten(),
            stdout: take_log(port, rank, "out"),
            stderr: take_log(port, rank, "err"),
        })
        .collect()
}
