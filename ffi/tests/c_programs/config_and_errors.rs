//! Nonblocking communicators (config and environment), NCCL error codes
//! for bad arguments, and `NCCL_DEBUG_FILE`.

use crate::{compile, run_one, work_dir};
use std::path::PathBuf;
use std::time::Duration;

#[test]
fn nonblocking_config_and_env_with_abort() {
    let exe = compile("nonblocking.c", &[]);
    let out = run_one(&exe, &["config"], &[], Duration::from_secs(150));
    assert!(out.contains("nonblocking config: OK"), "{out}");
    let out = run_one(
        &exe,
        &["env"],
        &[("NCCL_COMM_BLOCKING", "0")],
        Duration::from_secs(150),
    );
    assert!(out.contains("nonblocking env: OK"), "{out}");
}

#[test]
fn bad_arguments_and_usage_get_nccl_codes() {
    let exe = compile("errors.c", &[]);
    let out = run_one(&exe, &[], &[], Duration::from_secs(150));
    assert!(out.contains("errors: OK"), "{out}");
}

#[test]
fn debug_file_gets_the_log() {
    let exe = compile("errors.c", &[]);
    let dir = work_dir("debugfile");
    let pattern = dir.join("nccl.%h.%p.log");
    let envs = [
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "ALL"),
        ("NCCL_DEBUG_FILE", pattern.to_str().unwrap()),
    ];
    run_one(&exe, &[], &envs, Duration::from_secs(150));
    let logs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    let text = std::fs::read_to_string(&logs[0]).unwrap();
    assert!(
        text.contains("ncclCommShrink is not implemented"),
        "log file:\n{text}"
    );
    // NCCL's line form in the file too, and no colour codes.
    for line in text.lines() {
        let (head, _) = line
            .split_once(" NCCL ")
            .unwrap_or_else(|| panic!("not an NCCL line: {line:?}"));
        let (who, rank) = head.split_once(" [").expect("host:pid:tid [rank]");
        assert_eq!(who.split(':').count(), 3, "{line:?}");
        assert!(rank.ends_with(']'), "{line:?}");
        assert!(!line.contains('\u{1b}'), "{line:?}");
    }
}
