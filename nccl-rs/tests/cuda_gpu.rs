//! Real-GPU tests of the `cuda` feature (ignored: they need an NVIDIA GPU
//! and driver). Run with `cargo test -p nccl-rs --features cuda --test
//! cuda_gpu -- --ignored`; the full matrix of `cuda_fake/main.rs` also runs
//! on a GPU with `NCCL_RS_CUDA_TESTS=real` (see `scripts/gpu-check.sh`).
#![cfg(feature = "cuda")]

use nccl_rs::cuda::cudarc::driver::CudaContext;
use nccl_rs::cuda::{Stager, StagingOptions};
use nccl_rs::testing::{on_threads, Over};
use nccl_rs::{Config, RedOp};

#[test]
#[ignore = "needs an NVIDIA GPU and driver"]
fn probe_sees_a_gpu() {
    let info = nccl_rs::cuda::probe().expect("a CUDA driver and device");
    println!("{info}");
    assert!(!info.devices.is_empty());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver"]
fn four_ranks_share_one_gpu() {
    let cfg = Config {
        socket_ifname: Some("lo".into()),
        ..Config::default()
    };
    let n = 4;
    on_threads(n, &cfg, Over::Config, |r, mut comm| {
        let ctx = CudaContext::new(0).unwrap();
        let stream = ctx.new_stream().unwrap();
        let mut st = Stager::new(StagingOptions {
            chunk_bytes: 1 << 20,
            pipeline: true,
        });
        let c = (3 << 20) + 5;
        let x: Vec<f32> = (0..c).map(|i| (r * 100 + i % 101) as f32).collect();
        let send = stream.clone_htod(&x).unwrap();
        let mut recv = stream.alloc_zeros::<f32>(c).unwrap();
        st.all_reduce(&mut comm, &send, &mut recv, RedOp::Sum, &stream)
            .unwrap();
        let got = stream.clone_dtoh(&recv).unwrap();
        for (i, v) in got.iter().enumerate() {
            let want: f32 = (0..n).map(|q| (q * 100 + i % 101) as f32).sum();
            assert_eq!(*v, want, "rank {r} element {i}");
        }
        let mut all = stream.alloc_zeros::<f32>(n * c).unwrap();
        st.all_gather(&mut comm, &send, &mut all, &stream).unwrap();
        let got = stream.clone_dtoh(&all).unwrap();
        for q in 0..n {
            assert_eq!(got[q * c + 7], (q * 100 + 7) as f32);
        }
        let mut from_prev = stream.alloc_zeros::<f32>(c).unwrap();
        st.send_recv(
            &mut comm,
            &[(&send, (r + 1) % n)],
            &mut [(&mut from_prev, (r + n - 1) % n)],
            &stream,
        )
        .unwrap();
        let got = stream.clone_dtoh(&from_prev).unwrap();
        assert_eq!(got[3], (((r + n - 1) % n) * 100 + 3) as f32);

        let mut part = stream.alloc_zeros::<f32>(c / n).unwrap();
        let big = stream.clone_htod(&x[..(c / n) * n]).unwrap();
        st.reduce_scatter(&mut comm, &big, &mut part, RedOp::Max, &stream)
            .unwrap();
        let got = stream.clone_dtoh(&part).unwrap();
        let i = r * (c / n) + 11;
        assert_eq!(got[11], ((n - 1) * 100 + i % 101) as f32);

        let mut b = stream.clone_htod(&x).unwrap();
        st.broadcast(&mut comm, &mut b, n - 1, &stream).unwrap();
        assert_eq!(
            stream.clone_dtoh(&b).unwrap()[c - 1],
            ((n - 1) * 100 + (c - 1) % 101) as f32
        );

        let mut ones = stream.clone_htod(&vec![1i32; 1000]).unwrap();
        st.all_reduce_in_place(&mut comm, &mut ones, RedOp::Sum, &stream)
            .unwrap();
        assert_eq!(stream.clone_dtoh(&ones).unwrap(), vec![n as i32; 1000]);
    });
}
