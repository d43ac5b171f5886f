//! `fabric_check` as a program: its help, its usage errors and their exit
//! status, a run outside any launcher, and a 2-rank job on one host (no
//! links to measure: the all-reduce only, no outlier). The multi-host runs
//! are `scripts/fabric/check-test.sh`.

use std::process::Command;

fn fabric_check() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fabric_check"))
}

#[test]
fn help_is_the_usage_text() {
    let out = fabric_check().arg("-h").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        nccl_perf::fcheck::usage()
    );
}

#[test]
fn usage_errors_exit_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--bogus", "1"],
            "fabric_check: unknown flag \"--bogus\" (see -h)\n",
        ),
        (
            &["-n"],
            "fabric_check: -n: missing value (or unknown flag)\n",
        ),
        (
            &["--fraction", "2"],
            "fabric_check: --fraction \"2\": want a number in 0..1\n",
        ),
    ];
    for (argv, want) in cases {
        let out = fabric_check().args(*argv).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{argv:?}: {out:?}");
        assert_eq!(String::from_utf8(out.stderr).unwrap(), *want, "{argv:?}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn outside_a_launcher_it_says_so() {
    let out = fabric_check()
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("fabric_check: joining the job: ")
            && err.contains("no launcher environment"),
        "{err}"
    );
}

#[test]
fn one_host_has_no_links_and_passes() {
    let dir = std::env::temp_dir().join(format!("fabric_check_cli.{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("fc.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ncclrun"))
        .args(["-n", "2", "--timeout", "60"])
        .arg(env!("CARGO_BIN_EXE_fabric_check"))
        .args(["--ar-size", "64K", "--ar-iters", "2", "--json"])
        .arg(&json)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("# fabric_check: 1 hosts, 2 ranks, 0 rails; 0 rounds; best of 3 passes of 4194304 B x 4 per link direction"),
        "{stdout}"
    );
    assert_eq!(lines.last().copied(), Some("# outliers: none"), "{stdout}");
    let j = std::fs::read_to_string(&json).unwrap();
    assert!(j.starts_with("{\"hosts\":[\""), "{j}");
    assert!(j.contains("\"rails\":0,\"nics\":[],"), "{j}");
    assert!(j.contains("\"links\":[],"), "{j}");
    assert!(
        j.contains("\"allreduce\":{\"bytes\":65536,\"nranks\":2,"),
        "{j}"
    );
    assert!(
        j.ends_with(",\"bound_gbps\":0},\"outliers\":[],\"ok\":true}\n"),
        "{j}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
