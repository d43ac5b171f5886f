//! `ncclrun` names the rank that caused a failed job, by the rule of its
//! `--help`: a rank killed by a signal ncclrun did not send, then a rank
//! that was stopped and had to be killed, then the first non-zero exit;
//! and it never hangs on a stopped rank. Also: a perf tool's `-T` reaches
//! the communicator's timeout.
//!
//! Every run has a deadline; on the machine this was written on (2 cores,
//! a build beside it) the slowest finishes in about 15 s of its 90.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// ncclrun's grace (its `--help` says 5 s).
const GRACE: Duration = Duration::from_secs(5);
/// Slack for a busy 2-core machine, on top of every expected time.
const SLACK: Duration = Duration::from_secs(60);

/// A started ncclrun: its stdout lines arrive on `lines`, its stderr is
/// collected whole.
struct Job {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

fn start(mut cmd: Command) -> Job {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting ncclrun");
    let (tx, lines) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    Job {
        child,
        lines,
        stderr: Some(stderr),
    }
}

impl Job {
    /// Waits (until `deadline`) for a stdout line containing `what`.
    fn wait_line(&mut self, what: &str, deadline: Instant) {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(what) => return,
                Ok(_) => {}
                Err(_) => {
                    let _ = self.child.kill();
                    let (_, err) = self.finish(Duration::from_secs(10));
                    panic!("no line with {what:?} in time:\n{err}");
                }
            }
        }
    }

    /// Waits at most `limit` for ncclrun to exit; kills it (and so its
    /// ranks, by their parent-death signal) and fails if it does not.
    fn finish(&mut self, limit: Duration) -> (ExitStatus, String) {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let stderr = self.stderr.take().and_then(|h| h.join().ok());
                return (st, stderr.unwrap_or_default());
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("ncclrun did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid of rank `rank`: the child of ncclrun whose environment has
    /// `RANK=<rank>`.
    fn rank_pid(&self, rank: usize) -> u32 {
        let parent = self.child.id();
        let want = format!("RANK={rank}");
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The parent pid is the second field after the parenthesised name.
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid != Some(parent) {
                continue;
            }
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
                return pid;
            }
        }
        panic!("no child of ncclrun with {want}");
    }
}

fn signal(pid: u32, sig: i32) {
    let pid = libc::pid_t::try_from(pid).unwrap();
    // SAFETY: kill(2) only sends a signal; `pid` is a child of our child.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// `all_reduce_perf` arguments for a run that lasts until a rank stops.
const ENDLESS_ALL_REDUCE: [&str; 10] = [
    "-b",
    "8",
    "-e",
    "8",
    "-w",
    "1",
    "-c",
    "0",
    "-n",
    "1000000000",
];

fn ncclrun(n: usize) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ncclrun"));
    c.args(["-n", &n.to_string()]);
    c
}

/// The last line of ncclrun's stderr that starts with `ncclrun: job`.
fn verdict(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("ncclrun: job"))
        .unwrap_or_else(|| panic!("no verdict line:\n{stderr}"))
}

/// 4 ranks of all_reduce_perf with `NCCL_RS_TIMEOUT=5`; rank 2 is stopped in
/// the middle of the run. The others time out waiting for it and exit 1
/// (whichever first); ncclrun kills rank 2 after the grace and blames it.
#[test]
fn stopped_rank_is_named_not_the_first_to_exit() {
    let timeout = Duration::from_secs(5);
    let mut c = ncclrun(4);
    c.arg(env!("CARGO_BIN_EXE_all_reduce_perf"))
        .args(ENDLESS_ALL_REDUCE)
        .env("NCCL_RS_TIMEOUT", "5")
        .env("NCCL_RS_BOOTSTRAP_TIMEOUT", "60")
        .env("NCCL_SOCKET_IFNAME", "lo");
    let mut job = start(c);
    // The table header: every rank is up and in the sweep.
    job.wait_line("(us)", Instant::now() + SLACK);
    std::thread::sleep(Duration::from_millis(300));
    signal(job.rank_pid(2), libc::SIGSTOP);
    let stopped_at = Instant::now();
    let (st, err) = job.finish(timeout + GRACE + SLACK);
    let took = stopped_at.elapsed();
    let line = verdict(&err);
    assert!(
        line.starts_with("ncclrun: job failed: rank 2 stopped (SIGSTOP) and did not exit;"),
        "{line}\n{err}"
    );
    for r in ["0", "1", "3"] {
        assert!(line.contains(r), "rank {r} missing: {line}");
    }
    assert_eq!(st.code(), Some(137), "{err}");
    // It waited for the peers' timeout and one grace, not for ever.
    assert!(took >= timeout, "{took:?}\n{err}");
    println!("stopped rank 2; ncclrun exited after {took:?}: {line}");
}

/// `-T 3` is the communicator's timeout: with `NCCL_RS_TIMEOUT` unset (30
/// minutes), a stopped peer fails rank 0 after 3 s.
#[test]
fn perf_tool_timeout_flag_sets_the_operation_timeout() {
    let mut c = ncclrun(2);
    c.arg(env!("CARGO_BIN_EXE_all_reduce_perf"))
        .args(ENDLESS_ALL_REDUCE)
        .args(["-T", "3"])
        .env_remove("NCCL_RS_TIMEOUT")
        .env("NCCL_RS_BOOTSTRAP_TIMEOUT", "60")
        .env("NCCL_SOCKET_IFNAME", "lo");
    let mut job = start(c);
    job.wait_line("(us)", Instant::now() + SLACK);
    signal(job.rank_pid(1), libc::SIGSTOP);
    let (st, err) = job.finish(Duration::from_secs(3) + GRACE + SLACK);
    assert!(err.contains("timed out after 3s"), "{err}");
    assert!(
        verdict(&err).starts_with("ncclrun: job failed: rank 1 stopped (SIGSTOP)"),
        "{err}"
    );
    assert_eq!(st.code(), Some(137));
}

/// Shell ranks, no communicator: each tier of the rule once. Rows: ranks,
/// ncclrun options, each rank's shell script, the verdict line, the exit
/// status, the shortest time the run may take, the longest past the grace.
#[test]
fn blame_order_with_shell_ranks() {
    let table: [(usize, &[&str], &str, &str, i32, Duration, Duration); 4] = [
        // Ranks 0 and 2 exit 3 at once; rank 1 dies of SIGSEGV a little
        // later, within the grace: the crash is blamed, exit 128 + 11.
        (
            3,
            &[],
            "if [ $RANK = 1 ]; then sleep 0.5; kill -SEGV $$; fi; exit 3",
            "ncclrun: job failed: rank 1 killed by signal 11 (SIGSEGV); ranks 0, 2 exited with status 3",
            139,
            Duration::ZERO,
            GRACE + SLACK,
        ),
        // Rank 2 stops itself, the others exit 1: after the grace the
        // stopped rank is killed and blamed.
        (
            3,
            &[],
            "if [ $RANK = 2 ]; then kill -STOP $$; fi; exit 1",
            "ncclrun: job failed: rank 2 stopped (SIGSTOP) and did not exit; ranks 0, 1 exited with status 1",
            137,
            GRACE,
            GRACE + SLACK,
        ),
        // Rank 1 exits 4; the others wait (as for a peer in rendezvous) and
        // are killed after the grace, but the rank that failed is named.
        (
            3,
            &[],
            "if [ $RANK = 1 ]; then exit 4; fi; exec sleep 100",
            "ncclrun: job failed: rank 1 exited with status 4; ranks 0, 2 did not exit (killed by ncclrun)",
            4,
            Duration::ZERO,
            GRACE + SLACK,
        ),
        // --timeout with a stopped rank: exit 124, the stopped rank named.
        (
            2,
            &["--timeout", "1"],
            "if [ $RANK = 0 ]; then kill -STOP $$; fi; exec sleep 100",
            "ncclrun: job timed out after 1s: rank 0 stopped (SIGSTOP) and did not exit; rank 1 did not exit (killed by ncclrun)",
            124,
            Duration::ZERO,
            Duration::from_secs(1) + SLACK,
        ),
    ];
    for (n, opts, script, want, code, at_least, within) in table {
        let mut c = ncclrun(n);
        c.args(opts).args(["sh", "-c", script]);
        let t = Instant::now();
        let (st, err) = start(c).finish(within);
        assert_eq!(verdict(&err), want, "{err}");
        assert_eq!(st.code(), Some(code), "{want}");
        assert!(t.elapsed() >= at_least, "{want}: {:?}", t.elapsed());
    }
}
