//! What a rank does in each `NETNS_MODE` (`matrix`, `big`, `mismatch`,
//! `garbage`): run its cases and print its `CASES` and `RESULT` lines.

use super::{env, env_num, epoch_ms, fail, init_env, say};
use nccl_rs::{Communicator, Config, RedOp, UniqueId};
use nccl_tests_suite::cases::{matrix, run, select, Case};
use std::time::{Duration, Instant};

/// The seeded sample: `NETNS_CASES` of the small cases and `NETNS_LARGE`
/// of the large ones, in matrix order (identical on every rank).
pub(super) fn sample(n: usize) -> Vec<Case> {
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
pub(super) fn run_cases(comm: &mut Communicator, cases: &[Case], seed: u64) -> i32 {
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
pub(super) fn big(cfg: &Config, rank_env: usize) -> i32 {
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
pub(super) fn mismatch(cfg: &Config, rank_env: usize) -> i32 {
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
pub(super) fn garbage(cfg: &Config, rank_env: usize) -> i32 {
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
