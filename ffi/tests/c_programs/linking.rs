//! Building against the library: `nccl.h` in C and C++, the static
//! archive, and loading it from Python with ctypes.

use crate::{built, compile, dist, lib_dir, manifest, profile_dir, run_one, start, wait_all};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn header_compiles_in_c_and_cxx_with_and_without_cuda_headers() {
    for src in ["header.c", "header.cpp"] {
        let exe = compile(src, &["-pedantic"]);
        let out = run_one(&exe, &[], &[], Duration::from_secs(60));
        assert!(out.contains("header: OK"), "{out}");
        let fake = format!("-I{}", manifest().join("tests/c/fakecuda").display());
        compile(src, &["-c", &fake, "-DWITH_CUDA_FIRST"]);
        compile(src, &["-c", &fake, "-DWITH_CUDA_AFTER"]);
    }
}

#[test]
fn static_library_links() {
    let archive = built("libnccl.a");
    let out = profile_dir().join("nccl-c-tests/header_static");
    let o = Command::new("cc")
        .args(["-std=c11", "-I"])
        .arg(dist().join("include"))
        .arg(manifest().join("tests/c/header.c"))
        .arg(&archive)
        .args(["-lpthread", "-ldl", "-lm", "-lgcc_s", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "static link failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(run_one(&out, &[], &[], Duration::from_secs(60)).contains("header: OK"));
}

#[test]
fn python_ctypes_example() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("python3 not found: skipped");
        return;
    }
    let lib = lib_dir().join("libnccl.so.2");
    let script = manifest().join("examples/allreduce_ctypes.py");
    let mut c = Command::new("python3");
    c.arg(&script)
        .arg(&lib)
        .arg("3")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_RS_BOOTSTRAP_TIMEOUT", "60");
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let log = wait_all("ctypes", vec![start(c)], Duration::from_secs(200));
    assert!(log.contains("ctypes all-reduce: OK"), "{log}");
}
