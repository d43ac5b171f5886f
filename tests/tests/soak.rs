//! Soak: many random collectives across 4 processes, checked exactly, and
//! many communicator init/destroy cycles without resource growth.
//!
//! CI runs a seeded smaller version; `NCCL_RS_SOAK_FULL=1` runs the full
//! 20,000 collectives and 1,000 cycles (`NCCL_RS_SOAK_SEED` picks the seed).
//! Every run has an outer deadline.

use nccl_tests_suite::launch::run_ranks;
use std::time::Duration;

fn full() -> bool {
    std::env::var("NCCL_RS_SOAK_FULL").as_deref() == Ok("1")
}

fn seed() -> String {
    std::env::var("NCCL_RS_SOAK_SEED").unwrap_or_else(|_| "1".into())
}

/// Runs the soak worker at `n` ranks; asserts every rank exited 0.
fn soak(n: usize, env: &[(&str, String)], deadline: Duration) -> Vec<String> {
    let worker = env!("CARGO_BIN_EXE_soak_worker");
    let mut env = env.to_vec();
    env.push(("NCCL_RS_TIMEOUT", "120".into()));
    let outs = run_ranks(worker, &[], n, &env, deadline);
    let mut bad = Vec::new();
    let mut lines = Vec::new();
    for o in &outs {
        print!("{}", o.stdout);
        lines.extend(o.stdout.lines().map(String::from));
        if o.code != Some(0) {
            bad.push(format!(
                "rank {} exited {:?}\n{}{}",
                o.rank, o.code, o.stdout, o.stderr
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    lines
}

#[test]
fn random_collectives_4_processes_exact() {
    let count = if full() { 20_000 } else { 2_000 };
    let deadline = Duration::from_secs(if full() { 1800 } else { 600 });
    let lines = soak(
        4,
        &[
            ("SOAK_MODE", "random".into()),
            ("SOAK_COUNT", count.to_string()),
            ("SOAK_SEED", seed()),
        ],
        deadline,
    );
    let summaries = lines.iter().filter(|l| l.starts_with("SOAK ")).count();
    assert_eq!(summaries, 4, "every rank reports");
    assert!(lines
        .iter()
        .filter(|l| l.starts_with("SOAK "))
        .all(|l| l.contains(&format!("{count} random collectives")) && l.contains(", 0 wrong,")));
}

#[test]
fn init_destroy_cycles_4_processes_no_growth() {
    let cycles = if full() { 1000 } else { 100 };
    let deadline = Duration::from_secs(if full() { 1800 } else { 600 });
    let lines = soak(
        4,
        &[
            ("SOAK_MODE", "cycles".into()),
            ("SOAK_CYCLES", cycles.to_string()),
        ],
        deadline,
    );
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("CYCLES ")).count(),
        4,
        "every rank reports"
    );
    assert!(!lines.iter().any(|l| l.starts_with("LEAK ")));
}

#[test]
fn init_destroy_cycles_threads_no_growth() {
    let cycles = if full() { 1000 } else { 100 };
    let deadline = Duration::from_secs(if full() { 1800 } else { 600 });
    let env = [
        ("SOAK_MODE", "cycles-threads".into()),
        ("SOAK_CYCLES", cycles.to_string()),
        ("SOAK_RANKS", "4".into()),
    ];
    let lines = soak(1, &env, deadline);
    assert_eq!(lines.iter().filter(|l| l.starts_with("CYCLES ")).count(), 1);
    assert!(!lines.iter().any(|l| l.starts_with("LEAK ")));
}

/// Segments of processes that are gone (`nccl-rs-<pid>-*` whose pid no
/// longer exists) would be leaks that outlive a job; none may remain after
/// the soak runs above (they run before or alongside; this checks at its
/// own end too, after one more short job).
#[test]
fn no_orphan_shm_segments_after_a_job() {
    soak(
        4,
        &[
            ("SOAK_MODE", "random".into()),
            ("SOAK_COUNT", "200".into()),
            ("SOAK_SEED", seed()),
        ],
        Duration::from_secs(300),
    );
    let orphans: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| {
                    let Some(rest) = name.strip_prefix("nccl-rs-") else {
                        return false;
                    };
                    let pid = rest.split('-').next().unwrap_or("");
                    !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
                })
                .collect()
        })
        .unwrap_or_default();
    println!("orphan /dev/shm/nccl-rs-* segments: {}", orphans.len());
    assert!(
        orphans.is_empty(),
        "segments of dead processes left in /dev/shm: {orphans:?}"
    );
}
