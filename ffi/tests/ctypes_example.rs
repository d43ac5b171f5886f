//! Runs `ffi/examples/allreduce_ctypes.py` as the READMEs show it: from the
//! workspace root, with no library path, so that the example must find the
//! library this checkout built by itself.
//!
//! `cargo test` leaves the cdylib in `target/<profile>/deps` (only `cargo
//! build` copies it up), so the test first lays it out as
//! `ffi/scripts/dist.sh` does (`target/<profile>/nccl-dist/lib/libnccl.so.2`),
//! which the example then finds as the newest build.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the example may take; it runs in well under a second alone,
/// the rest is for a busy machine (its own ranks give up after 120 s).
const LIMIT: Duration = Duration::from_secs(200);

/// `target/<profile>`: this test runs from `target/<profile>/deps`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// The newest `libnccl.so` cargo made for this profile.
fn built_library() -> PathBuf {
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    [
        profile_dir().join("deps/libnccl.so"),
        profile_dir().join("libnccl.so"),
    ]
    .into_iter()
    .filter(|p| p.exists())
    .max_by_key(modified)
    .unwrap_or_else(|| panic!("libnccl.so not built in {}", profile_dir().display()))
}

/// Copies the library to `nccl-dist/lib/libnccl.so.2` (through a temporary
/// name: another test may be loading the old copy) and returns that path.
fn lay_out_dist() -> PathBuf {
    let lib = profile_dir().join("nccl-dist/lib");
    std::fs::create_dir_all(&lib).unwrap();
    let tmp = lib.join(format!(".libnccl.so.2.ctypes.{}", std::process::id()));
    std::fs::copy(built_library(), &tmp).unwrap();
    let dest = lib.join("libnccl.so.2");
    std::fs::rename(&tmp, &dest).unwrap();
    dest
}

#[test]
fn ctypes_example_runs_with_no_arguments() {
    if Command::new("python3").arg("--version").output().is_err() {
        println!("skipped: python3 not found");
        return;
    }
    let dist = lay_out_dist();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("ffi/ is in the workspace")
        .to_path_buf();
    let target = profile_dir()
        .parent()
        .expect("target/<profile>")
        .to_path_buf();
    let mut c = Command::new("python3");
    c.arg("ffi/examples/allreduce_ctypes.py")
        .current_dir(&workspace)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_RS_TIMEOUT", "60")
        .env("NCCL_RS_BOOTSTRAP_TIMEOUT", "60")
        .env_remove("NCCL_COMM_ID")
        // Its own group, so that a deadline kills its ranks too.
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The example finds `target/` beside itself, as a newcomer's run does;
    // only a target directory elsewhere needs telling.
    if target == workspace.join("target") {
        c.env_remove("CARGO_TARGET_DIR");
    } else {
        c.env("CARGO_TARGET_DIR", &target);
    }
    let mut child = c.spawn().expect("starting python3");
    let mut pipes = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ];
    let readers: Vec<_> = pipes
        .iter_mut()
        .filter_map(Option::take)
        .map(|mut p| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = p.read_to_string(&mut s);
                s
            })
        })
        .collect();
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > LIMIT {
            // The whole group: the launcher and its ranks.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            panic!("the ctypes example did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log: String = readers
        .into_iter()
        .map(|h| h.join().unwrap_or_default())
        .collect();
    assert!(status.success(), "{status}:\n{log}");
    assert!(log.contains("ctypes all-reduce: OK"), "{log}");
    assert!(log.contains("ctypes rank 0: all-reduce OK (3.0)"), "{log}");
    assert!(log.contains("ctypes rank 1: all-reduce OK (3.0)"), "{log}");
    // It loaded a build of this checkout: the copy just made, or a newer
    // one a concurrent `cargo build` wrote under the same target directory.
    let loaded = log
        .lines()
        .find_map(|l| l.strip_prefix("ctypes: loaded "))
        .and_then(|l| l.split(" (").next())
        .unwrap_or_else(|| panic!("no 'ctypes: loaded' line:\n{log}"));
    assert!(
        Path::new(loaded).starts_with(&target),
        "loaded {loaded}, not a build under {} (expected {}):\n{log}",
        target.display(),
        dist.display()
    );
}
