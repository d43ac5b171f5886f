//! Every collective × datatype × op × in/out-of-place × count × root, as
//! real processes at 1, 2, 3, 4, 5 and 8 ranks: over shared memory (the
//! default between processes of one host) and over TCP on loopback
//! (`NCCL_SHM_DISABLE=1`), with the ring, tree, direct and halving-doubling all-reduce.
//! Results are checked bit for bit by each rank (see `matrix_worker`).
//! The zero-copy path runs the same matrix with every buffer in shared host
//! memory (`NCCL_RS_TEST_BUFFERS=shared`), and with one rank's buffers not
//! (`mixed`: every rank must fall back to the transport, still exact).

use nccl_tests_suite::launch::{run_ranks, RankOutput};
use std::time::Duration;

fn matrix_at(n: usize) {
    matrix_with(n, &[]);
}

/// The matrix with extra environment (e.g. a forced algorithm); every
/// rank's output once all passed.
fn matrix_with(n: usize, extra: &[(&str, &str)]) -> Vec<RankOutput> {
    let worker = env!("CARGO_BIN_EXE_matrix_worker");
    let mut env = vec![("NCCL_RS_TIMEOUT", "120".to_string())];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let outs = run_ranks(worker, &[], n, &env, Duration::from_secs(900));
    let mut bad = Vec::new();
    for o in &outs {
        print!("{}", o.stdout);
        if o.code != Some(0) {
            bad.push(format!(
                "rank {} exited {:?}\n{}{}",
                o.rank, o.code, o.stdout, o.stderr
            ));
        }
    }
    assert!(bad.is_empty(), "{} ranks:\n{}", n, bad.join("\n"));
    outs
}

#[test]
fn matrix_1_rank() {
    matrix_at(1);
}

#[test]
fn matrix_2_ranks() {
    matrix_at(2);
}

#[test]
fn matrix_3_ranks() {
    matrix_at(3);
}

#[test]
fn matrix_4_ranks() {
    matrix_at(4);
}

#[test]
fn matrix_5_ranks() {
    matrix_at(5);
}

#[test]
fn matrix_8_ranks() {
    matrix_at(8);
}

#[test]
fn matrix_4_ranks_tree() {
    matrix_with(4, &[("NCCL_ALGO", "allreduce:tree")]);
}

#[test]
fn matrix_5_ranks_tree() {
    matrix_with(5, &[("NCCL_ALGO", "allreduce:tree")]);
}

#[test]
fn matrix_3_ranks_direct() {
    matrix_with(3, &[("NCCL_ALGO", "allreduce:direct")]);
}

#[test]
fn matrix_4_ranks_halving_doubling() {
    matrix_with(4, &[("NCCL_ALGO", "allreduce:halvingdoubling")]);
}

#[test]
fn matrix_6_ranks_halving_doubling() {
    // Two extra ranks fold into partners of the 4-rank core.
    matrix_with(6, &[("NCCL_ALGO", "allreduce:hd")]);
}

#[test]
fn matrix_5_ranks_halving_doubling_small_chunks() {
    // Many chunks per exchange through the fewest staging slots allowed.
    matrix_with(
        5,
        &[
            ("NCCL_ALGO", "allreduce:hd"),
            ("NCCL_BUFFSIZE", "65536"),
            ("NCCL_RS_STEPS", "2"),
        ],
    );
}

#[test]
fn matrix_8_ranks_small_chunks() {
    // Tiny staging slots: many pipelined chunks per call, every algorithm.
    matrix_with(8, &[("NCCL_BUFFSIZE", "65536"), ("NCCL_RS_STEPS", "4")]);
}

const TCP: (&str, &str) = ("NCCL_SHM_DISABLE", "1");

#[test]
fn matrix_2_ranks_tcp() {
    matrix_with(2, &[TCP]);
}

#[test]
fn matrix_3_ranks_tcp() {
    matrix_with(3, &[TCP]);
}

#[test]
fn matrix_4_ranks_tcp_tree() {
    matrix_with(4, &[TCP, ("NCCL_ALGO", "allreduce:tree")]);
}

#[test]
fn matrix_3_ranks_tcp_halving_doubling() {
    matrix_with(3, &[TCP, ("NCCL_ALGO", "allreduce:halvingdoubling")]);
}

#[test]
fn matrix_4_ranks_tcp_halving_doubling() {
    matrix_with(4, &[TCP, ("NCCL_ALGO", "allreduce:hd")]);
}

#[test]
fn matrix_5_ranks_tcp() {
    matrix_with(5, &[TCP]);
}

#[test]
fn matrix_8_ranks_tcp() {
    matrix_with(8, &[TCP]);
}

/// Rank 0's INFO line when its shared-memory receives may go single copy.
const CMA_ON: &str = "SHM: single copy by process_vm_readv";

/// Single copy (cross-memory attach) for every message of every call that
/// does not reduce, down to 64-byte messages: the matrix stays exact. As
/// root (as in CI) the kernel always lets a process read a sibling, so the
/// log must say single copy was on; otherwise the probe may refuse it and
/// the ring carries everything.
#[test]
fn matrix_2_ranks_single_copy() {
    let outs = matrix_with(
        2,
        &[
            INFO,
            ("NCCL_RS_SHM_SINGLE_COPY_MIN_BYTES", "64"),
            ("NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES", "1099511627776"),
        ],
    );
    let log = rank0_log(&outs);
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    });
    if root {
        assert!(
            log.contains(CMA_ON),
            "single copy never enabled on rank 0:\n{log}"
        );
    } else if !log.contains(CMA_ON) {
        println!("single copy refused by the kernel here; the ring carried everything");
    }
}

/// Streaming receives, the 2-rank all-gather through the ring, and
/// out-of-place all-to-all sent from a copy in shared memory, from 4 KiB of
/// output (`NCCL_RS_SHM_STREAM_BYTES`; half the last-level cache by
/// default, beyond the matrix's calls): the matrix stays exact.
#[test]
fn matrix_2_ranks_streaming_receives() {
    matrix_with(2, &[("NCCL_RS_SHM_STREAM_BYTES", "4096")]);
}

/// The matrix at 2 ranks with placement measured before every all-gather,
/// all-to-all and all-reduce from 4 KiB of output: it stays exact whatever
/// the verdicts, and both ranks' logs (traced by `nccl_rs::comm::placement`)
/// show them, some before an all-to-all and an all-reduce.
#[test]
fn matrix_2_ranks_placement_measured() {
    let outs = matrix_with(
        2,
        &[
            ("NCCL_RS_SHM_STREAM_BYTES", "4096"),
            ("RUST_LOG", "warn,nccl_rs::comm::placement=trace"),
        ],
    );
    for o in &outs {
        let log = format!("{}{}", o.stdout, o.stderr);
        let verdicts: Vec<_> = log
            .lines()
            .filter(|l| l.contains("cpu placement"))
            .collect();
        let before = |call: &str| verdicts.iter().filter(|l| l.contains(call)).count();
        let (a2a, ar) = (before("all_to_all"), before("all_reduce"));
        let judged = verdicts
            .iter()
            .filter(|l| ["Near", "Apart", "Unknown"].iter().any(|v| l.contains(v)))
            .count();
        assert!(
            !verdicts.is_empty() && judged == verdicts.len() && a2a > 0 && ar > 0,
            "rank {}: {judged} judged of {} probes, {a2a} before all-to-all, {ar} before all-reduce:\n{log}",
            o.rank,
            verdicts.len()
        );
    }
}

/// Placement fixed apart (`NCCL_RS_PLACEMENT=apart`): all-to-all goes single
/// copy in whole blocks from streamed staging, and ring messages stream.
#[test]
fn matrix_2_ranks_cpus_apart() {
    matrix_with(
        2,
        &[
            ("NCCL_RS_SHM_STREAM_BYTES", "4096"),
            ("NCCL_RS_PLACEMENT", "apart"),
        ],
    );
}

/// Placement fixed near: those calls take the ring in chunks, out-of-place
/// all-to-all too.
#[test]
fn matrix_2_ranks_cpus_near() {
    matrix_with(
        2,
        &[
            ("NCCL_RS_SHM_STREAM_BYTES", "4096"),
            ("NCCL_RS_PLACEMENT", "near"),
        ],
    );
}

/// The same with more local ranks than CPUs on a 2-CPU machine (receives
/// stream; every all-gather keeps its shape).
#[test]
fn matrix_3_ranks_streaming_receives() {
    matrix_with(3, &[("NCCL_RS_SHM_STREAM_BYTES", "4096")]);
}

/// Every buffer passed to a collective is an `nccl_rs::ShmBuffer`.
const SHARED: (&str, &str) = ("NCCL_RS_TEST_BUFFERS", "shared");
/// Shared buffers everywhere but on rank 1: all ranks must fall back.
const MIXED: (&str, &str) = ("NCCL_RS_TEST_BUFFERS", "mixed");
/// Every call tries the zero-copy path, even the 1-element cases.
const ZC_ALL: (&str, &str) = ("NCCL_RS_ZERO_COPY_MIN_BYTES", "1");
/// Logs at INFO (to stderr), where rank 0 says when zero copy first ran.
const INFO: (&str, &str) = ("NCCL_DEBUG", "INFO");
/// Rank 0's INFO line the first time the zero-copy path runs.
const ZC_RAN: &str = "SHM zero copy: collectives on shared buffers";

/// Rank 0's stdout and stderr.
fn rank0_log(outs: &[RankOutput]) -> String {
    format!("{}{}", outs[0].stdout, outs[0].stderr)
}

/// The matrix (exact, as every other) with `extra`, at INFO; checks from
/// rank 0's log that the zero-copy path ran (`ran`) or never did, and
/// that no rank failed to map a peer's buffer.
fn zero_copy_matrix(n: usize, extra: &[(&str, &str)], ran: bool) {
    let mut env = vec![INFO];
    env.extend_from_slice(extra);
    let outs = matrix_with(n, &env);
    let log = rank0_log(&outs);
    assert_eq!(
        log.contains(ZC_RAN),
        ran,
        "zero copy {} on rank 0:\n{log}",
        if ran { "never ran" } else { "ran" }
    );
    for o in &outs {
        assert!(
            !o.stderr.contains("cannot map"),
            "rank {}: a peer's buffer could not be mapped:\n{}",
            o.rank,
            o.stderr
        );
    }
}

#[test]
fn matrix_2_ranks_zero_copy() {
    zero_copy_matrix(2, &[SHARED, ZC_ALL], true);
}

#[test]
fn matrix_3_ranks_zero_copy() {
    zero_copy_matrix(3, &[SHARED, ZC_ALL], true);
}

#[test]
fn matrix_4_ranks_zero_copy() {
    zero_copy_matrix(4, &[SHARED, ZC_ALL], true);
}

#[test]
fn matrix_5_ranks_zero_copy_default_threshold() {
    // Small cases take the transport, the large ones (at least one per
    // collective in the sample) the zero-copy path, on one communicator.
    zero_copy_matrix(5, &[SHARED], true);
}

#[test]
fn matrix_3_ranks_zero_copy_mixed() {
    // Rank 1's buffers are `Vec`s: every call of every rank falls back.
    zero_copy_matrix(3, &[MIXED, ZC_ALL], false);
}

#[test]
fn matrix_3_ranks_zero_copy_resumes_after_heap_calls() {
    // Rank 1's buffers are `Vec`s for the first 100 cases, so every rank
    // falls back and skips the path for ever longer runs of calls; then all
    // buffers are shared and zero copy must run again (every rank skipping
    // the same calls, or the descriptor exchange would mismatch).
    zero_copy_matrix(
        3,
        &[("NCCL_RS_TEST_BUFFERS", "mixed-then-shared"), ZC_ALL],
        true,
    );
}

/// `NCCL_LOCAL_REGISTER=0` turns the zero-copy path off (a few cases of
/// the reducing collectives are enough to see it).
#[test]
fn zero_copy_off_with_local_register_0() {
    const SOME: (&str, &str) = ("NCCL_RS_TEST_FILTER", "dtype: Float32, op: Some(Sum)");
    let on = rank0_log(&matrix_with(2, &[SHARED, ZC_ALL, INFO, SOME]));
    assert!(
        on.contains(ZC_RAN),
        "no zero-copy log line on rank 0:\n{on}"
    );
    let off = rank0_log(&matrix_with(
        2,
        &[SHARED, ZC_ALL, INFO, SOME, ("NCCL_LOCAL_REGISTER", "0")],
    ));
    assert!(
        !off.contains("SHM zero copy"),
        "zero copy ran with NCCL_LOCAL_REGISTER=0:\n{off}"
    );
}
