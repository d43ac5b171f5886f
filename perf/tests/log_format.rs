//! The library's log lines as NCCL prints them, from a 2-rank run under
//! `ncclrun`: `host:pid:tid [rank] NCCL LEVEL message`, a numeric rank on
//! every line, the version line once per process, a line per peer
//! connection, and no WARN twice.

use std::collections::HashMap;
use std::process::Command;

/// Runs a 2-rank 8-byte all-reduce with `NCCL_DEBUG=debug`; its stderr.
fn run(debug: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ncclrun"))
        .args(["-n", "2", env!("CARGO_BIN_EXE_all_reduce_perf")])
        .args(["-b", "8", "-e", "8", "-n", "1", "-w", "1"])
        .env("NCCL_DEBUG", debug)
        .env_remove("RUST_LOG")
        .env_remove("NCCL_DEBUG_SUBSYS")
        .env_remove("NCCL_DEBUG_FILE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{}{err}",
        String::from_utf8_lossy(&out.stdout)
    );
    err
}

/// A line's pid, rank, level word and message, if it has the prefix
/// `^[^:]+:\d+:\d+ \[(\d+|-)\] NCCL (WARN|INFO|TRACE) `.
fn parse(line: &str) -> Option<(&str, &str, &str, &str)> {
    let (host, rest) = line.split_once(':')?;
    let (pid, rest) = rest.split_once(':')?;
    let (tid, rest) = rest.split_once(" [")?;
    let (rank, rest) = rest.split_once("] NCCL ")?;
    let (word, text) = rest.split_once(' ')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let ok = !host.is_empty()
        && !host.contains(char::is_whitespace)
        && digits(pid)
        && digits(tid)
        && (digits(rank) || rank == "-")
        && ["WARN", "INFO", "TRACE"].contains(&word);
    ok.then_some((pid, rank, word, text))
}

#[test]
fn info_lines_have_the_nccl_prefix_and_a_rank() {
    let err = run("INFO");
    assert!(!err.contains('\x1b'), "colour on a pipe:\n{err}");
    let mut versions = 0;
    let mut warns: HashMap<(&str, &str), usize> = HashMap::new();
    for line in err.lines() {
        // The launcher's own lines are not the library's.
        if line.starts_with("ncclrun: ") {
            continue;
        }
        let Some((pid, rank, word, text)) = parse(line) else {
            panic!("no NCCL prefix: {line:?}\n{err}");
        };
        assert!(
            rank == "0" || rank == "1",
            "no rank on a line of a launched rank: {line:?}"
        );
        if text.starts_with("NCCL version nccl-rs ") {
            assert_eq!(word, "INFO", "{line}");
            versions += 1;
        }
        if word == "WARN" {
            *warns.entry((pid, text)).or_default() += 1;
        }
    }
    assert_eq!(versions, 2, "one version line per process:\n{err}");
    for (peer, back) in [(0, 1), (1, 0)] {
        let want = format!("[{peer}] NCCL INFO Connected rank {peer} <-> {back} via ");
        assert!(err.contains(&want), "no {want:?}:\n{err}");
    }
    assert!(err.contains("NCCL INFO AllReduce: algorithm "), "{err}");
    let twice: Vec<_> = warns.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "WARNs printed twice: {twice:?}\n{err}");
}

#[test]
fn debug_version_prints_only_the_version() {
    let err = run("VERSION");
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    for l in lines {
        assert!(l.starts_with("NCCL version nccl-rs "), "{l:?}");
    }
}
