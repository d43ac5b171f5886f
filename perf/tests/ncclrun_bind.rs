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
            assert!(
                c.parse::<usize>().is_ok(),
                "rank bound to {c:?}, not one CPU"
            );
        }
        // Neighbouring ranks share a CPU only in blocks: the list never goes back.
        let ids: Vec<usize> = bound.iter().map(|c| c.parse().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] <= w[1]), "{ids:?}");
        assert_eq!(allowed("none", n), vec![ours.clone(); n]);
    }
}

/// Bound ranks are still seen as one per CPU, so shared-memory single copy
/// stays on at 2 ranks (it is off only when local ranks outnumber the
/// host's CPUs, not the one CPU each rank is bound to). As root the kernel
/// always allows the cross-memory read, so the INFO line must be there.
#[test]
fn bound_ranks_keep_single_copy() {
    // SAFETY: sysconf only reads a system value.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    });
    if online < 2 || !root {
        println!("skipped: {online} CPUs online, root: {root}");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ncclrun"))
        .args(["-n", "2", env!("CARGO_BIN_EXE_all_gather_perf")])
        .args(["-b", "1M", "-e", "1M", "-n", "2", "-w", "1", "-c", "1"])
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("SHM: single copy by process_vm_readv"),
        "single copy off for bound ranks:\n{text}"
    );
}
