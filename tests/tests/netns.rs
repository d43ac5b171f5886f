//! Multi-host fault tests: `scripts/netns/run.sh` puts each of 4 ranks in a
//! network namespace of its own, joined by a bridge, and injects packet
//! loss, SIGKILL, link down, garbage and strays, and mismatched
//! collectives; it prints a table and exits non-zero on any failure.
//!
//! Needs root and `ip netns` (skipped with a printed reason otherwise; CI
//! runs as root). The whole run has an outer deadline.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Why the namespaces cannot be used here, if they cannot.
fn unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next().map(String::from));
    if uid.as_deref() != Some("0") {
        return Some(format!(
            "not root (uid {})",
            uid.unwrap_or_else(|| "?".into())
        ));
    }
    let probe = format!("ncclns-probe-{}", std::process::id());
    match Command::new("ip")
        .args(["netns", "add", &probe])
        .stderr(Stdio::piped())
        .output()
    {
        Err(e) => return Some(format!("no `ip` command ({e})")),
        Ok(o) if !o.status.success() => {
            return Some(format!(
                "cannot create a network namespace: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Ok(_) => {
            let _ = Command::new("ip").args(["netns", "del", &probe]).status();
        }
    }
    None
}

#[test]
fn faults_on_network_namespaces() {
    if let Some(why) = unavailable() {
        println!("netns fault tests skipped: {why}");
        return;
    }
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_netns_worker"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let script = repo().join("scripts/netns/run.sh");
    let log = std::env::temp_dir().join(format!("nccl-rs-netns-{}.log", std::process::id()));
    let out = std::fs::File::create(&log).expect("log file");
    let mut child = Command::new("bash")
        .arg(&script)
        .env("NETNS_BIN_DIR", &bin_dir)
        .env("NETNS_NO_BUILD", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .process_group(0)
        .spawn()
        .expect("run scripts/netns/run.sh");
    let deadline = Duration::from_secs(420);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > deadline {
            // The whole process group: the script, the ranks, the stranger.
            let _ = Command::new("kill")
                .args(["-9", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            let _ = Command::new("bash")
                .arg(repo().join("scripts/netns/teardown.sh"))
                .status();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut text = String::new();
    let _ = std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut text));
    let _ = std::fs::remove_file(&log);
    println!("{text}");
    match status {
        None => panic!("scripts/netns/run.sh did not finish within {deadline:?}"),
        Some(s) => assert!(
            s.success(),
            "scripts/netns/run.sh failed ({s}); output above"
        ),
    }
}
