//! `NCCL_RS_CUDA_DISABLE=1`: CUDA is never loaded, on any machine.
#![cfg(feature = "cuda")]

use nccl_rs::cuda::{classify, CudaError, MemKind};

#[test]
fn disabled_means_host_memory_everywhere() {
    // The only test of this binary: set before anything reads it.
    std::env::set_var("NCCL_RS_CUDA_DISABLE", "1");
    let e = std::panic::catch_unwind(nccl_rs::cuda::probe)
        .expect("no panic")
        .unwrap_err();
    assert!(matches!(e, CudaError::Disabled), "{e:?}");
    assert_eq!(e.to_string(), "CUDA is disabled (NCCL_RS_CUDA_DISABLE)");
    let v = [1u8; 4];
    assert_eq!(classify(v.as_ptr().cast()), MemKind::Host);
    let core = e.clone().into_error(3);
    assert!(
        core.to_string().contains("rank 3: CUDA: CUDA is disabled"),
        "{core}"
    );
    assert!(matches!(CudaError::of(&core), Some(CudaError::Disabled)));
}
