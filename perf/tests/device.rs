//! `--device 1`: with the `cuda` feature, against the fake CUDA driver
//! (`ffi/tests/cuda/fake_libcuda.c`, built here with `cc`; the CPU cannot
//! touch its device memory), a 2-rank `all_reduce_perf` under `ncclrun`
//! checks every size with 0 wrong elements; without a usable driver, or
//! without the feature, the tool says why and exits with status 1.

#[cfg(feature = "cuda")]
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tool(name: &str) -> &'static str {
    match name {
        "all_reduce_perf" => env!("CARGO_BIN_EXE_all_reduce_perf"),
        "ncclrun" => env!("CARGO_BIN_EXE_ncclrun"),
        _ => unreachable!("{name}"),
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[cfg(feature = "cuda")]
#[path = "../../ffi/tests/cuda/fake_driver.rs"]
mod fake_build;

/// Builds the fake driver once per test process.
#[cfg(feature = "cuda")]
fn fake_driver() -> &'static Path {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| fake_build::build_in_tmp("fakecuda-perf"))
}

/// The `#wrong` columns (out of place, in place) of every result row.
#[cfg(feature = "cuda")]
fn wrong_columns(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 13, "row {l:?}");
            (f[8].to_string(), f[12].to_string())
        })
        .collect()
}

#[cfg(feature = "cuda")]
#[test]
fn all_reduce_on_device_buffers_two_ranks() {
    let lib = fake_driver();
    let o = Command::new(tool("ncclrun"))
        .args(["-n", "2", tool("all_reduce_perf")])
        .args(["--device", "1", "-b", "8", "-e", "3M", "-f", "8", "-c", "1"])
        .args(["-n", "2", "-w", "1", "-o", "all"])
        .env("NCCL_RS_CUDA_DRIVER", lib)
        .env("NCCL_RS_CUDA_STAGING_CHUNK", "64K")
        .env_remove("NCCL_RS_CUDA_DISABLE")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Fake CUDA Device 0] device memory"), "{out}");
    let rows = wrong_columns(&out);
    // 8, 64, ..., 2M bytes (7 sizes), for each of the 5 operations.
    assert_eq!(rows.len(), 7 * 5, "{out}");
    assert!(rows.iter().all(|(a, b)| a == "0" && b == "0"), "{out}");
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
}

/// Ranks as threads pick device `local rank % count`, as nccl-tests.
#[cfg(feature = "cuda")]
#[test]
fn threads_spread_over_two_devices() {
    let lib = fake_driver();
    let o = Command::new(tool("all_reduce_perf"))
        .args([
            "-t", "2", "--device", "1", "-b", "1K", "-e", "256K", "-f", "16",
        ])
        .args(["-c", "1", "-n", "2", "-w", "1"])
        .env("NCCL_RS_CUDA_DRIVER", lib)
        .env("FAKE_CUDA_DEVICES", "2")
        .env_remove("NCCL_RS_CUDA_DISABLE")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("device  0 [0000:10:00.0 Fake CUDA Device 0] device memory")
            && out.contains("device  1 [0000:11:00.0 Fake CUDA Device 1] device memory"),
        "{out}"
    );
    let rows = wrong_columns(&out);
    assert_eq!(rows.len(), 3, "{out}");
    assert!(rows.iter().all(|(a, b)| a == "0" && b == "0"), "{out}");
}

#[cfg(feature = "cuda")]
#[test]
fn device_flag_without_a_driver_is_a_clean_error() {
    let o = Command::new(tool("all_reduce_perf"))
        .args(["--device", "1", "-b", "1K", "-e", "1K"])
        .env("NCCL_RS_CUDA_DISABLE", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--device 1: CUDA is disabled"), "{}", text(&o));
    assert!(!err.contains("panicked"), "{}", text(&o));
}

#[cfg(not(feature = "cuda"))]
#[test]
fn device_flag_needs_the_cuda_feature() {
    let o = Command::new(tool("all_reduce_perf"))
        .args(["--device", "1", "-b", "1K", "-e", "1K"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--features cuda"), "{}", text(&o));
    assert!(!err.contains("panicked"), "{}", text(&o));
}
