//! Failures end in a clear error on every rank, within seconds: a rank
//! killed mid-collective, and mismatched collectives. Real processes over
//! TCP on loopback; every run has an outer deadline.

use nccl_tests_suite::launch::{free_port, kill_and_take_logs, run_ranks, spawn_rank};
use std::time::{Duration, Instant};

/// One scenario at a time: each picks a free rendezvous port, and two
/// picking at once could collide (each takes well under a second).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn results(fault: &str, bad: usize, n: usize) -> Vec<(usize, bool, u64, String)> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let worker = env!("CARGO_BIN_EXE_fault_worker");
    let env = [
        ("FAULT", fault.to_string()),
        ("FAULT_RANK", bad.to_string()),
        ("NCCL_RS_TIMEOUT", "60".into()),
    ];
    let outs = run_ranks(worker, &[], n, &env, Duration::from_secs(120));
    let mut res = Vec::new();
    for o in &outs {
        for line in o.stdout.lines().filter(|l| l.starts_with("RESULT ")) {
            let mut it = line.splitn(5, ' ').skip(1);
            let rank = it.next().unwrap().parse().unwrap();
            let ok = it.next().unwrap() == "ok";
            let ms = it.next().unwrap().parse().unwrap();
            res.push((rank, ok, ms, it.next().unwrap_or("").to_string()));
        }
    }
    res
}

/// Every rank but `bad` reports an error within 10 s naming `bad`.
fn survivors_name_the_dead(fault: &str, n: usize, bad: usize) {
    let res = results(fault, bad, n);
    assert_eq!(res.len(), n - 1, "every survivor reports: {res:?}");
    let name = format!("rank {bad}");
    for (rank, ok, ms, err) in &res {
        assert_ne!(*rank, bad);
        assert!(!ok, "rank {rank} should have failed");
        assert!(*ms < 10_000, "rank {rank} took {ms} ms to notice");
        assert!(
            err.contains(&name),
            "rank {rank}: error does not name {name}: {err}"
        );
    }
}

/// Every rank reports an "invalid usage" error within 10 s containing each
/// of `needles`.
fn every_rank_reports_mismatch(fault: &str, n: usize, bad: usize, needles: &[&str]) {
    let res = results(fault, bad, n);
    assert_eq!(res.len(), n, "{res:?}");
    for (rank, ok, ms, err) in &res {
        assert!(!ok, "rank {rank} should have failed");
        assert!(*ms < 10_000, "rank {rank} took {ms} ms");
        assert!(err.contains("invalid usage"), "rank {rank}: {err}");
        for needle in needles {
            assert!(err.contains(needle), "rank {rank}: no {needle:?} in {err}");
        }
    }
}

#[test]
fn killed_rank_fails_every_survivor_within_seconds() {
    survivors_name_the_dead("die", 4, 2);
}

#[test]
fn killed_rank_fails_every_survivor_on_the_zero_copy_path() {
    // 64 MiB all-reduces on shared buffers: ranks read and write each
    // other's buffers; the survivors must still end with an error naming
    // the dead rank, not hang or crash.
    survivors_name_the_dead("die_shared", 3, 1);
}

#[test]
fn mismatched_collectives_on_shared_buffers_name_ranks_and_calls() {
    every_rank_reports_mismatch(
        "mismatch_shared",
        3,
        2,
        &[
            "rank 2 called broadcast(count=65536, float, root=0)",
            "all_reduce(count=65536, float, sum)",
        ],
    );
}

#[test]
fn mismatched_collectives_name_ranks_and_calls() {
    every_rank_reports_mismatch(
        "mismatch",
        3,
        1,
        &[
            "rank 1 called broadcast(count=1024, float, root=0) as operation #3",
            "all_reduce(count=1024, float, sum)",
        ],
    );
}

#[test]
fn no_fault_no_error() {
    let res = results("none", 0, 3);
    assert_eq!(res.len(), 3);
    assert!(res.iter().all(|r| r.1), "{res:?}");
}

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(") ")?.1.to_string();
            after.chars().next()
        })
        .is_some_and(|c| c == 'T' || c == 't')
}

/// 4 ranks launched torchrun-style (no ncclrun), `NCCL_RS_TIMEOUT=5`, rank 2
/// stopped by SIGSTOP in a loop of all-reduces: every other rank, rank 0
/// with the bootstrap root included, fails naming rank 2 and exits within
/// `NCCL_RS_TIMEOUT` + 5 s of the stop (rank 0 waited 120 s for the stopped
/// rank to leave the root before).
#[test]
fn a_stopped_rank_does_not_hold_the_others_exit() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const N: usize = 4;
    const BAD: usize = 2;
    let port = free_port();
    let env = [
        ("FAULT", "stop".to_string()),
        ("FAULT_RANK", BAD.to_string()),
        ("NCCL_RS_TIMEOUT", "5".to_string()),
    ];
    let mut children: Vec<_> = (0..N)
        .map(|r| spawn_rank(env!("CARGO_BIN_EXE_fault_worker"), &[], (r, N), port, &env))
        .collect();
    let start = Instant::now();
    let mut stopped_at = None;
    let mut exited: Vec<Option<Duration>> = vec![None; N];
    while exited
        .iter()
        .enumerate()
        .any(|(r, e)| r != BAD && e.is_none())
    {
        if stopped_at.is_none() && stopped(children[BAD].id()) {
            stopped_at = Some(Instant::now());
        }
        for (r, c) in children.iter_mut().enumerate() {
            if r != BAD && exited[r].is_none() && c.try_wait().unwrap().is_some() {
                let since = stopped_at.map(|t| t.elapsed()).unwrap_or_default();
                exited[r] = Some(since);
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let logs = kill_and_take_logs(&mut children, port, N);
    assert!(stopped_at.is_some(), "rank {BAD} never stopped: {logs:#?}");
    println!("exit after rank {BAD} stopped: {exited:?}");
    for r in (0..N).filter(|&r| r != BAD) {
        let took = exited[r].unwrap_or_else(|| panic!("rank {r} never exited: {logs:#?}"));
        assert!(
            took <= Duration::from_secs(10),
            "rank {r} exited {took:?} after rank {BAD} stopped (limit NCCL_RS_TIMEOUT + 5 s)"
        );
        let (out, err) = &logs[r];
        let line = out
            .lines()
            .find(|l| l.starts_with("RESULT "))
            .unwrap_or_default();
        assert!(line.contains(" err "), "rank {r}: {line}\n{err}");
        assert!(
            line.contains(&format!("rank {BAD}")),
            "rank {r} does not name rank {BAD}: {line}"
        );
    }
}
