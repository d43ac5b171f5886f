//! Device reductions: the host fallback without kernels, a forced GPU
//! reduction failing cleanly, and GPU float folds in rank order.

use crate::drv::{Dev, Stream};
use crate::{fake_driver, ranks, real, same, val};
use nccl_rs::comm::raw::{RawArgs, RawColl};
use nccl_rs::cuda::{DeviceReduce, Stager};
use nccl_rs::{Communicator, DataType, RedOp};

/// One all-reduce, reduce-scatter or reduce of `i32` on device buffers,
/// returning the call's result instead of unwrapping it.
#[allow(clippy::too_many_arguments)]
fn try_coll(
    st: &mut Stager,
    comm: &mut Communicator,
    s: &Stream,
    coll: RawColl,
    send: &Dev<i32>,
    recv: &Dev<i32>,
    count: usize,
    op: RedOp,
) -> nccl_rs::Result<()> {
    let args = RawArgs {
        coll,
        send: send.ptr().cast_const(),
        recv: recv.ptr(),
        count,
        dtype: DataType::Int32,
        op,
        root: 1,
    };
    // SAFETY: device allocations of the sizes NCCL defines.
    unsafe { st.collective(comm, &args, s.id(), None) }
}

#[test]
fn device_reductions_fall_back_to_the_host_without_kernels() {
    fake_driver();
    let probe = nccl_rs::cuda::device_reduce_probe();
    if real() {
        println!(
            "device reduction kernels: {}",
            probe.expect("kernels on a real GPU")
        );
    } else {
        // No NVRTC, or (with NCCL_RS_NVRTC_LIBRARY) a driver without modules.
        let e = probe
            .expect_err("the fake driver runs no kernels")
            .to_string();
        assert!(e.contains("NVRTC") || e.contains("cuModuleLoadData"), "{e}");
    }
    ranks(3, |r, comm, s, st| {
        st.set_device_reduce(DeviceReduce::Auto);
        let (n, c) = (3, 1001);
        let mine: Vec<i32> = (0..n * c).map(|i| val(r, i) - 3000).collect();
        let send = Dev::from(&mine, s);
        let at = |q: usize, i: usize| val(q, i) - 3000;
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Avg] {
            let fold = |i: usize| {
                let v = (0..n).map(|q| at(q, i));
                match op {
                    RedOp::Sum => v.fold(0i32, i32::wrapping_add),
                    RedOp::Prod => v.fold(1i32, i32::wrapping_mul),
                    RedOp::Min => v.min().unwrap(),
                    _ => v.fold(0i32, i32::wrapping_add) / n as i32,
                }
            };
            let out = Dev::zeros(c, s);
            try_coll(st, comm, s, RawColl::AllReduce, &send, &out, c, op).unwrap();
            let want: Vec<i32> = (0..c).map(fold).collect();
            same(&out.read(s), &want, &format!("rank {r}: all-reduce {op}"));
            try_coll(st, comm, s, RawColl::ReduceScatter, &send, &out, c, op).unwrap();
            let want: Vec<i32> = (0..c).map(|i| fold(r * c + i)).collect();
            same(
                &out.read(s),
                &want,
                &format!("rank {r}: reduce-scatter {op}"),
            );
            let root = Dev::zeros(c, s);
            try_coll(st, comm, s, RawColl::Reduce, &send, &root, c, op).unwrap();
            if r == 1 {
                let want: Vec<i32> = (0..c).map(fold).collect();
                same(&root.read(s), &want, &format!("rank {r}: reduce {op}"));
            }
        }
    });
}

#[test]
fn forced_gpu_reduction_without_kernels_fails_cleanly() {
    ranks(2, |r, comm, s, st| {
        st.set_device_reduce(DeviceReduce::Gpu);
        let send = Dev::from(&vec![r as i32 + 1; 100], s);
        let out = Dev::zeros(100, s);
        let got = try_coll(
            st,
            comm,
            s,
            RawColl::AllReduce,
            &send,
            &out,
            100,
            RedOp::Sum,
        );
        if !real() {
            let e = got.expect_err("no kernels on the fake driver");
            let cause = nccl_rs::cuda::CudaError::of(&e)
                .expect("a CUDA error")
                .to_string();
            assert!(cause.contains("NCCL_RS_CUDA_REDUCE=gpu"), "{cause}");
            // The communicator is still usable, with host reductions.
            st.set_device_reduce(DeviceReduce::Host);
            try_coll(
                st,
                comm,
                s,
                RawColl::AllReduce,
                &send,
                &out,
                100,
                RedOp::Sum,
            )
            .unwrap();
        } else {
            got.unwrap();
        }
        same(&out.read(s), &[3; 100], &format!("rank {r}: all-reduce"));
    });
}

#[test]
fn gpu_float_reductions_fold_in_rank_order() {
    if !real() {
        println!("SKIPPED: needs a real GPU (NCCL_RS_CUDA_TESTS=real)");
        return;
    }
    if let Err(e) = nccl_rs::cuda::device_reduce_probe() {
        println!("SKIPPED: no GPU reduction kernels: {e}");
        return;
    }
    ranks(3, |r, comm, s, st| {
        st.set_device_reduce(DeviceReduce::Gpu);
        let (n, c) = (3usize, 3001usize);
        let at = |q: usize, i: usize| {
            let x = ((q * 7919 + i * 104729) % 65537) as f32;
            (x - 32768.0) / 7.0 * if i.is_multiple_of(5) { 1e-30 } else { 1.0 }
        };
        let mine: Vec<f32> = (0..c).map(|i| at(r, i)).collect();
        let send = Dev::from(&mine, s);
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg] {
            let out = Dev::<f32>::zeros(c, s);
            let args = RawArgs {
                coll: RawColl::AllReduce,
                send: send.ptr().cast_const(),
                recv: out.ptr(),
                count: c,
                dtype: DataType::Float32,
                op,
                root: 0,
            };
            // SAFETY: device allocations of `c` floats.
            unsafe { st.collective(comm, &args, s.id(), None) }.unwrap();
            let want: Vec<u32> = (0..c)
                .map(|i| {
                    let mut acc = at(0, i);
                    for q in 1..n {
                        let x = at(q, i);
                        acc = match op {
                            RedOp::Prod => acc * x,
                            RedOp::Max => acc.max(x),
                            RedOp::Min => acc.min(x),
                            _ => acc + x,
                        };
                    }
                    if op == RedOp::Avg {
                        acc /= n as f32;
                    }
                    acc.to_bits()
                })
                .collect();
            let got: Vec<u32> = out.read(s).iter().map(|x| x.to_bits()).collect();
            same(
                &got,
                &want,
                &format!("rank {r}: f32 all-reduce {op} on the GPU"),
            );
        }
    });
}
