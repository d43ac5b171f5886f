//! `ncclrun --help` says what ncclrun does: every variable it sets or
//! removes in a rank's environment (checked against a real rank's), the
//! CPU binding, the grace before the remaining ranks are killed, how the
//! culprit is chosen, and the exit statuses.

use std::collections::BTreeMap;
use std::process::Command;

fn help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ncclrun"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn env_map(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn help_names_the_environment_binding_grace_and_exit_codes() {
    let h = help();
    let wanted = [
        "RANK=",
        "WORLD_SIZE=",
        "LOCAL_RANK=",
        "LOCAL_WORLD_SIZE=",
        "MASTER_ADDR=127.0.0.1",
        "MASTER_PORT=",
        "NCCL_RS_JOB_SECRET",
        "--bind core|none",
        "one CPU",
        "unbound",
        "grace of 5 s",
        "SIGKILL",
        "stopped",
        "SIGSTOP",
        "culprit",
        "exit status:",
        "every rank exited 0",
        "128+S",
        "124",
        "usage error",
        "127",
    ];
    for w in wanted {
        assert!(h.contains(w), "--help does not mention {w:?}:\n{h}");
    }
    // The exit status lines give the number first.
    for code in ["0 ", "1-255 ", "128+S ", "124 ", "2 ", "126, 127 ", "1 "] {
        assert!(
            h.lines().any(|l| l.trim_start().starts_with(code)),
            "no exit status line for {code:?}:\n{h}"
        );
    }
}

/// Every variable ncclrun adds, changes or removes in a rank's environment
/// is named in `--help`.
#[test]
fn help_lists_exactly_what_a_rank_sees_changed() {
    let h = help();
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    let given = [
        ("PATH", path.as_str()),
        ("KEPT_AS_IS", "1"),
        ("RANK", "9"),
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("PMI_RANK", "5"),
        ("SLURM_PROCID", "5"),
        ("GROUP_RANK", "1"),
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_ncclrun"))
        .args(["--bind", "none", "-n", "1", "env"])
        .env_clear()
        .envs(given)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let child = env_map(&String::from_utf8_lossy(&out.stdout));
    let parent: BTreeMap<String, String> = given
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut changed = Vec::new();
    for (k, v) in &child {
        if parent.get(k) != Some(v) {
            changed.push(k.clone());
        }
    }
    for k in parent.keys() {
        if !child.contains_key(k) {
            changed.push(k.clone());
        }
    }
    assert_eq!(child.get("KEPT_AS_IS").map(String::as_str), Some("1"));
    assert_eq!(child.get("RANK").map(String::as_str), Some("0"));
    for k in [
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
        "GROUP_RANK",
    ] {
        assert!(!child.contains_key(k), "{k} reached the rank");
    }
    for k in &changed {
        // A whole word of the help: `RANK` must not pass for `LOCAL_RANK`.
        let named = h
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| w == k);
        assert!(
            named,
            "ncclrun changes {k} but --help does not say so:\n{h}"
        );
    }
}

#[test]
fn usage_error_exits_2() {
    for args in [&["-n", "0", "true"][..], &["--bogus"], &["-n", "2"], &[]] {
        let out = Command::new(env!("CARGO_BIN_EXE_ncclrun"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}
