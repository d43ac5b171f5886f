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

/// The stranger: connects to every listening port of the job and misbehaves.
#[path = "netns_worker/attack.rs"]
mod attack;
#[path = "netns_worker/ranks.rs"]
mod ranks;

use nccl_rs::{Communicator, Config};
use ranks::{big, garbage, mismatch, run_cases, sample};
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
