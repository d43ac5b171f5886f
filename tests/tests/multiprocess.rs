//! Every collective × datatype × op × in/out-of-place × count × root, as
//! real processes at 1, 2, 3, 4, 5 and 8 ranks: over shared memory (the
//! default between processes of one host) and over TCP on loopback
//! (`NCCL_SHM_DISABLE=1`), with the ring, tree, direct and halving-doubling all-reduce.
//! Results are checked bit for bit by each rank (see `matrix_worker`).

use nccl_tests_suite::launch::run_ranks;
use std::time::Duration;

fn matrix_at(n: usize) {
    matrix_with(n, &[]);
}

/// The matrix with extra environment (e.g. a forced algorithm).
fn matrix_with(n: usize, extra: &[(&str, &str)]) {
    let worker = env!("CARGO_BIN_EXE_matrix_worker");
    let mut env = vec![("NCCL_TIMEOUT", "120".to_string())];
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
            ("NCCL_STEPS", "2"),
        ],
    );
}

#[test]
fn matrix_8_ranks_small_chunks() {
    // Tiny staging slots: many pipelined chunks per call, every algorithm.
    matrix_with(8, &[("NCCL_BUFFSIZE", "65536"), ("NCCL_STEPS", "4")]);
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
