//! Compiles the C programs of `tests/c` against `include/nccl.h` with the
//! system's `cc` / `c++`, links them against the built `libnccl.so.2`, and
//! runs them (several processes where they need it). Also checks what the
//! library exports, its SONAME and what it loads.
//!
//! The cdylib is found beside this test's executable (`target/<profile>`
//! or its `deps/`).
//! `nccl-dist/` there gets `libnccl.so.2` (a copy) and the `libnccl.so`
//! link, as an installed NCCL has. Every run has a deadline.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[path = "c_programs/exports.rs"]
mod exports;

#[path = "c_programs/linking.rs"]
mod linking;

#[path = "c_programs/collectives.rs"]
mod collectives;

#[path = "c_programs/config_and_errors.rs"]
mod config_and_errors;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>`, where cargo put `libnccl.so`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// The newest build of `name`: `cargo test` links the library in
/// `target/<profile>/deps` without copying it up (`cargo build` does).
fn built(name: &str) -> PathBuf {
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let candidates = [
        profile_dir().join("deps").join(name),
        profile_dir().join(name),
    ];
    let newest = candidates
        .iter()
        .filter(|p| p.exists())
        .max_by_key(|p| modified(p));
    newest
        .unwrap_or_else(|| panic!("{name} not built in {}", profile_dir().display()))
        .clone()
}

/// `nccl-dist/`: `lib/libnccl.so.2`, `lib/libnccl.so -> libnccl.so.2`,
/// `include/nccl.h`. Made once per test process.
fn dist() -> &'static Path {
    static DIST: OnceLock<PathBuf> = OnceLock::new();
    DIST.get_or_init(|| {
        let built = built("libnccl.so");
        let dist = profile_dir().join("nccl-dist");
        let lib = dist.join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(dist.join("include")).unwrap();
        let tmp = lib.join(format!(".libnccl.so.2.{}", std::process::id()));
        std::fs::copy(&built, &tmp).unwrap();
        std::fs::rename(&tmp, lib.join("libnccl.so.2")).unwrap();
        let link = lib.join("libnccl.so");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("libnccl.so.2", &link).unwrap();
        std::fs::copy(
            manifest().join("include/nccl.h"),
            dist.join("include/nccl.h"),
        )
        .unwrap();
        dist
    })
}

fn lib_dir() -> PathBuf {
    dist().join("lib")
}

fn work_dir(name: &str) -> PathBuf {
    let d = profile_dir()
        .join("nccl-c-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles `tests/c/<src>` (C, or C++ for `.cpp`) into an executable
/// linked against the library; `extra` adds flags. Each (source, flags)
/// is compiled once per test process (tests run in parallel).
fn compile(src: &str, extra: &[&str]) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let key = format!("{src} {}", extra.join(" "));
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, exe)) = built.iter().find(|(k, _)| *k == key) {
        return exe.clone();
    }
    let exe = compile_now(src, extra);
    built.push((key, exe.clone()));
    exe
}

fn compile_now(src: &str, extra: &[&str]) -> PathBuf {
    let cxx = src.ends_with(".cpp");
    let out = profile_dir().join("nccl-c-tests").join(format!(
        "{}{}",
        src.replace('.', "_"),
        extra.concat().replace(['-', '=', '/'], "_")
    ));
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let mut cmd = Command::new(if cxx { "c++" } else { "cc" });
    cmd.args(if cxx { ["-std=c++11"] } else { ["-std=c11"] })
        .args([
            "-D_POSIX_C_SOURCE=200809L",
            "-D_DEFAULT_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-g",
        ])
        .arg("-I")
        .arg(dist().join("include"))
        .arg("-I")
        .arg(manifest().join("tests/c"))
        .args(extra)
        .arg(manifest().join("tests/c").join(src))
        .arg("-o")
        .arg(&out);
    if !extra.contains(&"-c") {
        cmd.arg("-L")
            .arg(lib_dir())
            .arg("-lnccl")
            .arg(format!("-Wl,-rpath,{}", lib_dir().display()))
            .arg("-lpthread");
    }
    let o = cmd.output().expect("running the C compiler");
    assert!(
        o.status.success(),
        "compiling {src} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The environment of every program: loopback, bounded deadlines.
fn command(exe: &Path) -> Command {
    let mut c = Command::new(exe);
    c.env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_RS_TIMEOUT", "60")
        .env("NCCL_RS_BOOTSTRAP_TIMEOUT", "60")
        .env_remove("NCCL_COMM_BLOCKING")
        .env_remove("NCCL_COMM_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A started program whose output is being collected.
struct Running {
    child: Child,
    output: Vec<std::thread::JoinHandle<String>>,
}

fn start(mut c: Command) -> Running {
    let mut child = c.spawn().expect("starting a test program");
    let mut output = Vec::new();
    let pipes: [Option<Box<dyn Read + Send>>; 2] = [
        child.stdout.take().map(|p| Box::new(p) as _),
        child.stderr.take().map(|p| Box::new(p) as _),
    ];
    for mut pipe in pipes.into_iter().flatten() {
        output.push(std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        }));
    }
    Running { child, output }
}

/// Waits for every program (all must exit 0), killing all at the deadline.
/// Returns their output, each line prefixed with `what` and the index.
fn wait_all(what: &str, mut running: Vec<Running>, limit: Duration) -> String {
    let start = Instant::now();
    let mut codes: Vec<Option<std::process::ExitStatus>> = vec![None; running.len()];
    while codes.iter().any(Option::is_none) {
        for (r, code) in running.iter_mut().zip(codes.iter_mut()) {
            if code.is_none() {
                *code = r.child.try_wait().expect("try_wait");
            }
        }
        if start.elapsed() > limit {
            for r in &mut running {
                let _ = r.child.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut log = String::new();
    for (i, r) in running.into_iter().enumerate() {
        let mut child = r.child;
        let _ = child.wait();
        for h in r.output {
            for line in h.join().unwrap_or_default().lines() {
                log.push_str(&format!("[{what} {i}] {line}\n"));
            }
        }
    }
    eprint!("{log}");
    for (i, code) in codes.iter().enumerate() {
        match code {
            Some(s) if s.success() => {}
            Some(s) => panic!("{what} process {i} failed: {s}\n{log}"),
            None => panic!("{what} process {i} did not finish within {limit:?}\n{log}"),
        }
    }
    log
}

fn run_one(exe: &Path, args: &[&str], envs: &[(&str, &str)], limit: Duration) -> String {
    let mut c = command(exe);
    c.args(args).envs(envs.iter().copied());
    wait_all(
        &exe.file_name().unwrap().to_string_lossy(),
        vec![start(c)],
        limit,
    )
}

fn tool_output(tool: &str, args: &[&str], file: &Path) -> String {
    let o = Command::new(tool)
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("running {tool}: {e}"));
    assert!(
        o.status.success(),
        "{tool} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
