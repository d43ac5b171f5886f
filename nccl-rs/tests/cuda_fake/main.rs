//! The `cuda` feature against a fake CUDA driver (`ffi/tests/cuda/fake_libcuda.c`,
//! built here with `cc`): device memory the CPU cannot touch, streams that
//! run their copies later on their own threads. So these tests run the
//! whole staging path (classification, contexts, stream ordering, the
//! chunked pipeline, exact results) on machines without a GPU.
//!
//! With `NCCL_RS_CUDA_TESTS=real` the same tests run on the real driver
//! and GPU instead (`scripts/gpu-check.sh` does this).
#![cfg(feature = "cuda")]

use nccl_rs::cuda::{Stager, StagingOptions};
use nccl_rs::testing::{loopback, on_threads, Over};
use nccl_rs::Communicator;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The few driver calls the tests make themselves (streams, copies,
/// pinned memory), looked up in the driver `nccl_rs::cuda` loaded
/// (globally). cudarc's typed layer is tested on a real GPU only
/// (`cuda_gpu.rs`): its loader wants every symbol of its bindings, which
/// the fake does not have.
mod drv;

#[path = "../../../ffi/tests/cuda/fake_driver.rs"]
mod fake_build;

mod collectives;
mod device_probe;
mod device_reduce;
mod send_recv;

use drv::Stream;

/// Whether the tests run on the real driver (`NCCL_RS_CUDA_TESTS=real`).
fn real() -> bool {
    std::env::var("NCCL_RS_CUDA_TESTS").is_ok_and(|v| v == "real")
}

/// Builds the fake driver once and points `NCCL_RS_CUDA_DRIVER` at it (unless
/// [`real`]). Every test calls this first, so the variables are set before
/// any thread reads the environment.
fn fake_driver() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if real() {
            return PathBuf::new();
        }
        let lib = fake_build::build_in_tmp("fakecuda");
        std::env::set_var("NCCL_RS_CUDA_DRIVER", &lib);
        std::env::set_var("FAKE_CUDA_DELAY_US", "50");
        std::env::set_var("FAKE_CUDA_DMABUF", "1");
        lib
    })
}

/// Runs `f(rank, comm, stream, stager)` on `n` ranks, threads of this
/// process sharing the (fake) GPU, each with its own stream and stager.
fn ranks(n: usize, f: impl Fn(usize, &mut Communicator, &Stream, &mut Stager) + Sync) {
    fake_driver();
    let cfg = loopback(Duration::from_secs(60));
    on_threads(n, &cfg, Over::Config, |r, mut comm| {
        drv::bind_device0();
        let stream = Stream::new();
        let mut stager = Stager::new(StagingOptions {
            chunk_bytes: 4096,
            pipeline: true,
        });
        f(r, &mut comm, &stream, &mut stager);
        stream.sync();
    });
}

/// Compares two vectors, reporting the first difference (not all of it).
#[track_caller]
fn same<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: element {i} is {:?}, expected {:?}",
            got[i], want[i]
        );
    }
}

/// Element i of rank r's input: exact in f32 and i32 sums and products.
fn val(r: usize, i: usize) -> i32 {
    (r as i32 + 1) * 1000 + (i % 97) as i32
}
