//! The C ABI with the `cuda` feature: device buffers and stream semantics
//! (`tests/cuda/device_check.c`) against a fake CUDA driver
//! (`tests/cuda/fake_libcuda.c`: device memory the CPU cannot touch,
//! streams that run later on their own threads), so it runs without a GPU.
//! The host-memory C programs of `tests/c` must also pass with a driver
//! present. `real_gpu_*` (ignored) run the same program on a real GPU.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[path = "cuda/fake_driver.rs"]
mod fake_build;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Our work directory: `lib/libnccl.so.2` (this build, cuda feature),
/// `lib/libcuda.so.1` (the fake driver, kept apart in `fake/`), programs.
fn work() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = profile_dir().join(format!("nccl-cuda-tests-{}", std::process::id()));
        let lib = dir.join("lib");
        let fake = dir.join("fake");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(&fake).unwrap();
        let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let built = [
            profile_dir().join("deps/libnccl.so"),
            profile_dir().join("libnccl.so"),
        ]
        .into_iter()
        .filter(|p| p.exists())
        .max_by_key(modified)
        .expect("libnccl.so built");
        std::fs::copy(built, lib.join("libnccl.so.2")).unwrap();
        std::os::unix::fs::symlink("libnccl.so.2", lib.join("libnccl.so")).unwrap();
        fake_build::build(&fake);
        dir
    })
}

fn cc(args: &[&str]) {
    let o = Command::new("cc").args(args).output().expect("running cc");
    assert!(
        o.status.success(),
        "cc {args:?}:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Compiles a C test program against include/nccl.h and our library.
fn program(src: &Path, name: &str) -> PathBuf {
    let out = work().join(name);
    let lib = work().join("lib");
    cc(&[
        "-std=c11",
        "-D_POSIX_C_SOURCE=200809L",
        "-D_DEFAULT_SOURCE",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-O1",
        "-I",
        manifest().join("include").to_str().unwrap(),
        "-I",
        manifest().join("tests/c").to_str().unwrap(),
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-L",
        lib.to_str().unwrap(),
        "-lnccl",
        &format!("-Wl,-rpath,{}", lib.display()),
        "-ldl",
        "-lpthread",
    ]);
    out
}

fn fake_driver() -> PathBuf {
    work().join("fake/libcuda.so.1")
}

/// Runs `exe args` with `envs`, killing it after `limit`.
fn run(exe: &Path, args: &[&str], envs: &[(&str, &str)], limit: Duration) -> String {
    let mut child = Command::new(exe)
        .args(args)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_RS_TIMEOUT", "60")
        .env("NCCL_RS_BOOTSTRAP_TIMEOUT", "60")
        .env_remove("NCCL_COMM_ID")
        .env_remove("NCCL_COMM_BLOCKING")
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o: Output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("{text}");
    assert!(
        o.status.success(),
        "{} {args:?} failed ({}):\n{text}",
        exe.display(),
        o.status
    );
    text
}

fn device_check() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        program(
            &manifest().join("tests/cuda/device_check.c"),
            "device_check",
        )
    })
    .clone()
}

#[test]
fn device_buffers_on_the_fake_driver_two_and_three_ranks() {
    let drv = fake_driver();
    let exe = device_check();
    for n in ["2", "3"] {
        let out = run(
            &exe,
            &[n],
            &[
                ("NCCL_RS_CUDA_DRIVER", drv.to_str().unwrap()),
                ("FAKE_CUDA_DELAY_US", "100"),
                // Several pipeline steps per call.
                ("NCCL_RS_CUDA_STAGING_CHUNK", "256K"),
            ],
            Duration::from_secs(300),
        );
        assert!(out.contains("device_check: OK"), "{out}");
        assert!(out.contains("Fake CUDA Device 0"), "{out}");
        assert!(out.contains(ASYNC_OK), "{out}");
        assert!(
            out.contains("send and recv on two held streams each"),
            "{out}"
        );
        assert!(out.contains(INTERLEAVED_OK), "{out}");
    }
}

/// `device_check` printed this after calls returned while their streams
/// were blocked by the test, and their results were exact.
const ASYNC_OK: &str = "async: calls returned while their streams were blocked";
const INTERLEAVED_OK: &str = "host and device calls interleaved";
const ASYNC_SKIPPED: &str = "async checks skipped";

#[test]
fn async_failures_surface_and_release_the_streams() {
    let drv = fake_driver();
    let out = run(
        &device_check(),
        &["2", "async-fail"],
        &[
            ("NCCL_RS_CUDA_DRIVER", drv.to_str().unwrap()),
            // The calls wait for streams the test holds: they time out.
            ("NCCL_RS_TIMEOUT", "2"),
            // Abort and destroy return while the test holds the streams,
            // also where frees wait for every stream (they run apart).
            ("FAKE_CUDA_FREE_SYNCS", "1"),
        ],
        Duration::from_secs(120),
    );
    assert!(
        out.contains("a timed-out call surfaced as ncclTimeout and released its stream"),
        "{out}"
    );
    assert!(
        out.contains("ncclCommAbort with calls waiting on blocked streams returned"),
        "{out}"
    );
    assert!(
        out.contains("ncclCommDestroy with calls waiting on blocked streams returned"),
        "{out}"
    );
}

#[test]
fn nonblocking_communicators_gate_device_calls() {
    let drv = fake_driver();
    let out = run(
        &device_check(),
        &["3", "nonblocking"],
        &[
            ("NCCL_RS_CUDA_DRIVER", drv.to_str().unwrap()),
            ("NCCL_COMM_BLOCKING", "0"),
        ],
        Duration::from_secs(120),
    );
    assert!(
        out.contains("non-blocking communicators returned ncclInProgress with held streams"),
        "{out}"
    );
}

#[test]
fn nccl_cuda_async_0_and_missing_stream_memops_keep_the_blocking_path() {
    let drv = fake_driver();
    for (knob, why) in [
        (("NCCL_RS_CUDA_ASYNC", "0"), "NCCL_RS_CUDA_ASYNC=0"),
        (
            ("FAKE_CUDA_MEMOPS", "0"),
            "a trial cuStreamWaitValue32 failed",
        ),
    ] {
        let out = run(
            &device_check(),
            &["2"],
            &[
                ("NCCL_RS_CUDA_DRIVER", drv.to_str().unwrap()),
                ("NCCL_DEBUG", "INFO"),
                knob,
            ],
            Duration::from_secs(300),
        );
        assert!(out.contains("device_check: OK"), "{out}");
        assert!(out.contains(ASYNC_SKIPPED), "{out}");
        assert!(out.contains(INTERLEAVED_OK), "{out}");
        assert!(
            out.contains("calls block until the stream's earlier work is done")
                && out.contains(why),
            "{out}"
        );
        assert!(!out.contains("calls return at once"), "{out}");
    }
}

#[test]
fn device_buffers_whole_buffer_staging_and_two_fake_gpus() {
    let drv = fake_driver();
    let out = run(
        &device_check(),
        &["4"],
        &[
            ("NCCL_RS_CUDA_DRIVER", drv.to_str().unwrap()),
            ("FAKE_CUDA_DEVICES", "2"),
            ("NCCL_RS_CUDA_PIPELINE", "0"),
            ("NCCL_DEBUG", "INFO"),
        ],
        Duration::from_secs(300),
    );
    assert!(out.contains("device_check: OK"), "{out}");
    assert!(out.contains(ASYNC_OK), "{out}");
    assert!(out.contains("calls return at once"), "{out}");
    assert!(out.contains("staged through pinned host memory"), "{out}");
    // ncclCommRegister logs the buffer's path through the network (netreg).
    assert!(
        out.contains("NET/GDR: ") && out.contains("staging through pinned host memory"),
        "{out}"
    );
}

/// Frees that synchronize implicitly, as the real driver's may: a free on
/// the proxy thread while a gated stream waits for it would never return
/// (the fake aborts after a while instead). Whole-buffer staging and a
/// sweep of growing sizes make the staging buffers grow during gated calls;
/// the old ones must be kept until the communicator is destroyed.
#[test]
fn staging_buffers_grow_during_gated_calls_without_freeing() {
    let drv = fake_driver();
    let env = [
        ("NCCL_RS_CUDA_DRIVER", drv.to_str().unwrap()),
        ("FAKE_CUDA_FREE_SYNCS", "1"),
        ("FAKE_CUDA_FREE_SYNC_TIMEOUT_S", "20"),
        ("FAKE_CUDA_DELAY_US", "0"),
        // Whole buffers: every larger call needs larger staging buffers.
        ("NCCL_RS_CUDA_PIPELINE", "0"),
        ("NCCL_DEBUG", "INFO"),
    ];
    for args in [&["4"][..], &["2", "perf", "4K", "1M", "1"][..]] {
        let out = run(&device_check(), args, &env, Duration::from_secs(300));
        assert!(out.contains("calls return at once"), "{out}");
        assert!(
            out.contains("outgrown buffer"),
            "no staging buffer was outgrown: {out}"
        );
        assert!(!out.contains("fake libcuda:"), "{out}");
        if args.len() == 1 {
            assert!(out.contains("device_check: OK"), "{out}");
            assert!(out.contains(ASYNC_OK), "{out}");
        } else {
            assert!(out.contains("# Avg bus bandwidth"), "{out}");
        }
    }
}

#[test]
fn perf_sweep_on_the_fake_driver() {
    let drv = fake_driver();
    let out = run(
        &device_check(),
        &["2", "perf", "4K", "1M", "2"],
        &[
            ("NCCL_RS_CUDA_DRIVER", drv.to_str().unwrap()),
            ("FAKE_CUDA_DELAY_US", "0"),
        ],
        Duration::from_secs(300),
    );
    assert!(out.contains("# Avg bus bandwidth"), "{out}");
    assert_eq!(
        out.lines()
            .filter(|l| l.trim_start().starts_with("1048576"))
            .count(),
        1,
        "{out}"
    );
}

#[test]
fn host_memory_programs_pass_with_a_driver_present() {
    let drv = fake_driver();
    let envs = [
        ("NCCL_RS_CUDA_DRIVER", drv.to_str().unwrap()),
        ("FAKE_CUDA_DEVICES", "4"),
    ];
    let exe = program(&manifest().join("tests/c/initall.c"), "initall");
    assert!(run(&exe, &[], &envs, Duration::from_secs(300)).contains("initall: OK"));
    let exe = program(&manifest().join("tests/c/errors.c"), "errors");
    assert!(run(&exe, &[], &envs, Duration::from_secs(150)).contains("errors: OK"));
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver"]
fn real_gpu_device_check() {
    let exe = device_check();
    for n in ["1", "2", "4"] {
        assert!(run(&exe, &[n], &[], Duration::from_secs(300)).contains("device_check: OK"));
    }
    run(
        &exe,
        &["2", "perf", "1K", "64M", "5"],
        &[],
        Duration::from_secs(300),
    );
}
