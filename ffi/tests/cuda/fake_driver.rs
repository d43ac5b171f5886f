//! Builds the fake CUDA driver (`fake_libcuda.c`, next to this file): the
//! one recipe of every test that runs on it. Test crates of the workspace
//! include this file by path:
//!
//! ```ignore
//! #[path = "../../ffi/tests/cuda/fake_driver.rs"]
//! mod fake_driver;
//! ```
//!
//! Each sets its own environment (`NCCL_RS_CUDA_DRIVER`, `FAKE_CUDA_*`), since
//! what it needs differs.
// Each test crate uses a part of this file.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `fake_libcuda.c`. Every crate that includes this file lies one level
/// below the workspace root, as `ffi/` does.
pub(crate) fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ffi/tests/cuda/fake_libcuda.c")
}

/// Builds `dir/libcuda.so.1` (creating `dir`) and returns its path;
/// `Err(why)` when `cc` cannot be run. Written under a temporary name and
/// renamed, so a process sharing `dir` never loads half a library.
///
/// # Panics
/// If the compiler fails: the fake driver is ours and must build.
pub(crate) fn try_build(dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let lib = dir.join("libcuda.so.1");
    let tmp = dir.join(format!(".libcuda.{}", std::process::id()));
    let o = Command::new("cc")
        .args([
            "-shared",
            "-fPIC",
            "-O1",
            "-pthread",
            "-Wl,-soname,libcuda.so.1",
        ])
        .arg(source())
        .arg("-o")
        .arg(&tmp)
        .output()
        .map_err(|e| format!("running cc: {e}"))?;
    assert!(
        o.status.success(),
        "building the fake driver: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, &lib).unwrap();
    Ok(lib)
}

/// [`try_build`], panicking when `cc` cannot be run.
pub(crate) fn build(dir: &Path) -> PathBuf {
    try_build(dir).unwrap_or_else(|why| panic!("building the fake CUDA driver: {why}"))
}

/// [`build`] into `name` under the test crate's `CARGO_TARGET_TMPDIR`.
pub(crate) fn build_in_tmp(name: &str) -> PathBuf {
    build(&Path::new(env!("CARGO_TARGET_TMPDIR")).join(name))
}
