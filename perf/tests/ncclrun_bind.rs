//! `ncclrun` binds its ranks to CPUs (`--bind core`, the default) or not
//! (`--bind none`): each rank reports the CPUs it may run on.

use std::process::Command;

/// Each rank's `Cpus_allowed_list`, by rank.
fn allowed(bind: &str, n: usize) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_ncclrun"))
        .args(["--bind", bind, "-n", &n.to_string(), "sh", "-c"])
        .arg("echo $RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut lines: Vec<(usize, String)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (r, cpus) = l.split_once(' ').unwrap();
            (r.parse().unwrap(), cpus.trim().to_string())
        })
        .collect();
    lines.sort();
    assert_eq!(lines.len(), n);
    lines.into_iter().map(|(_, c)| c).collect()
}

#[test]
fn ranks_are_bound_one_cpu_each_or_in_blocks() {
    let ours = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = ours
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    for n in [1, 2, 3, 4] {
        let bound = allowed("core", n);
        for c in &bound {
            assert!(c.parse::<usize>().is_ok(), "rank bound to {c:?}, not one CPU");
        }
        // Neighbouring ranks share a CPU only in blocks: the list never goes back.
        let ids: Vec<usize> = bound.iter().map(|c| c.parse().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] <= w[1]), "{ids:?}");
        assert_eq!(allowed("none", n), vec![ours.clone(); n]);
    }
}
