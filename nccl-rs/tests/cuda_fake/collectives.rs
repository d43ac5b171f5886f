//! Raw collectives on device buffers through the stager: every
//! collective, in-place layouts, stream ordering, PreMulSum, and host
//! buffers that need no staging.

use crate::drv::{Dev, Pinned, Stream};
use crate::{ranks, same, val};
use nccl_rs::comm::raw::{RawArgs, RawColl};
use nccl_rs::cuda::Stager;
use nccl_rs::{Communicator, DataType, RedOp};

/// Runs one raw collective on device buffers through the stager.
#[allow(clippy::too_many_arguments)]
fn coll(
    stager: &mut Stager,
    comm: &mut Communicator,
    stream: &Stream,
    coll: RawColl,
    send: Option<&Dev<i32>>,
    recv: &Dev<i32>,
    count: usize,
    op: RedOp,
    root: usize,
) {
    let args = RawArgs {
        coll,
        send: send.map_or(recv.ptr(), Dev::ptr).cast_const(),
        recv: recv.ptr(),
        count,
        dtype: DataType::Int32,
        op,
        root,
    };
    // SAFETY: device allocations of the sizes NCCL defines.
    unsafe { stager.collective(comm, &args, stream.id(), None) }.unwrap();
}

#[test]
fn every_collective_on_device_buffers_is_exact() {
    for n in [2usize, 3] {
        ranks(n, |r, comm, s, st| {
            let c = 1000; // 4096-byte chunks: several per call
            let mine: Vec<i32> = (0..c).map(|i| val(r, i)).collect();
            let send = Dev::from(&mine, s);
            let sum: Vec<i32> = (0..c).map(|i| (0..n).map(|q| val(q, i)).sum()).collect();

            // All-reduce, out of place and in place (max).
            let out = Dev::zeros(c, s);
            coll(
                st,
                comm,
                s,
                RawColl::AllReduce,
                Some(&send),
                &out,
                c,
                RedOp::Sum,
                0,
            );
            same(&out.read(s), &sum, &format!("rank {r}: all-reduce"));
            let inplace = Dev::from(&mine, s);
            coll(
                st,
                comm,
                s,
                RawColl::AllReduce,
                None,
                &inplace,
                c,
                RedOp::Max,
                0,
            );
            let max: Vec<i32> = (0..c).map(|i| val(n - 1, i)).collect();
            same(&inplace.read(s), &max, &format!("rank {r}: in-place max"));

            // All-gather.
            let all = Dev::zeros(n * c, s);
            coll(
                st,
                comm,
                s,
                RawColl::AllGather,
                Some(&send),
                &all,
                c,
                RedOp::Sum,
                0,
            );
            let want: Vec<i32> = (0..n * c).map(|j| val(j / c, j % c)).collect();
            same(&all.read(s), &want, &format!("rank {r}: all-gather"));

            // Reduce-scatter: block q of every rank's input goes to rank q.
            let big: Vec<i32> = (0..n * c).map(|j| val(r, j) + j as i32).collect();
            let big_d = Dev::from(&big, s);
            let part = Dev::zeros(c, s);
            coll(
                st,
                comm,
                s,
                RawColl::ReduceScatter,
                Some(&big_d),
                &part,
                c,
                RedOp::Sum,
                0,
            );
            let want: Vec<i32> = (0..c)
                .map(|i| {
                    let j = r * c + i;
                    (0..n).map(|q| val(q, j) + j as i32).sum()
                })
                .collect();
            same(&part.read(s), &want, &format!("rank {r}: reduce-scatter"));

            // All-to-all: block q of rank p lands as block p at rank q.
            let a2a = Dev::zeros(n * c, s);
            coll(
                st,
                comm,
                s,
                RawColl::AllToAll,
                Some(&big_d),
                &a2a,
                c,
                RedOp::Sum,
                0,
            );
            let want: Vec<i32> = (0..n * c)
                .map(|j| {
                    let (p, i) = (j / c, j % c);
                    val(p, r * c + i) + (r * c + i) as i32
                })
                .collect();
            same(&a2a.read(s), &want, &format!("rank {r}: all-to-all"));

            // Broadcast from the last rank, in place.
            let root = n - 1;
            let b = Dev::from(&mine, s);
            coll(
                st,
                comm,
                s,
                RawColl::Broadcast,
                None,
                &b,
                c,
                RedOp::Sum,
                root,
            );
            let want: Vec<i32> = (0..c).map(|i| val(root, i)).collect();
            same(&b.read(s), &want, &format!("rank {r}: broadcast"));

            // Reduce to rank 0 (others pass a receive buffer NCCL ignores).
            let red = Dev::zeros(c, s);
            coll(
                st,
                comm,
                s,
                RawColl::Reduce,
                Some(&send),
                &red,
                c,
                RedOp::Sum,
                0,
            );
            if r == 0 {
                same(&red.read(s), &sum, "reduce");
            }

            // Gather to rank 1, scatter from rank 1.
            let g = Dev::zeros(n * c, s);
            coll(
                st,
                comm,
                s,
                RawColl::Gather,
                Some(&send),
                &g,
                c,
                RedOp::Sum,
                1,
            );
            if r == 1 {
                let want: Vec<i32> = (0..n * c).map(|j| val(j / c, j % c)).collect();
                same(&g.read(s), &want, "gather");
            }
            let sc = Dev::zeros(c, s);
            coll(
                st,
                comm,
                s,
                RawColl::Scatter,
                Some(&big_d),
                &sc,
                c,
                RedOp::Sum,
                1,
            );
            let want: Vec<i32> = (0..c)
                .map(|i| val(1, r * c + i) + (r * c + i) as i32)
                .collect();
            same(&sc.read(s), &want, &format!("rank {r}: scatter"));
        });
    }
}

#[test]
fn in_place_all_gather_and_reduce_scatter_layouts() {
    ranks(3, |r, comm, s, st| {
        let (n, c) = (3, 777);
        // All-gather in place: this rank's part already sits at r * c.
        let mut buf: Vec<i32> = vec![-1; n * c];
        for i in 0..c {
            buf[r * c + i] = val(r, i);
        }
        let d = Dev::from(&buf, s);
        let args = RawArgs {
            coll: RawColl::AllGather,
            send: d.ptr().wrapping_add(r * c * 4),
            recv: d.ptr(),
            count: c,
            dtype: DataType::Int32,
            op: RedOp::Sum,
            root: 0,
        };
        // SAFETY: NCCL's in-place all-gather layout in one allocation.
        unsafe { st.collective(comm, &args, s.id(), None) }.unwrap();
        let want: Vec<i32> = (0..n * c).map(|j| val(j / c, j % c)).collect();
        same(&d.read(s), &want, "in-place all-gather");

        // Reduce-scatter in place: the result lands at block r.
        let input: Vec<i32> = (0..n * c).map(|j| val(r, j)).collect();
        let d = Dev::from(&input, s);
        let args = RawArgs {
            coll: RawColl::ReduceScatter,
            send: d.ptr(),
            recv: d.ptr().wrapping_add(r * c * 4),
            ..args
        };
        // SAFETY: NCCL's in-place reduce-scatter layout.
        unsafe { st.collective(comm, &args, s.id(), None) }.unwrap();
        let got = d.read(s);
        let want: Vec<i32> = (0..c)
            .map(|i| (0..n).map(|q| val(q, r * c + i)).sum())
            .collect();
        same(&got[r * c..(r + 1) * c], &want, "in-place reduce-scatter");
    });
}

#[test]
fn input_written_by_earlier_stream_work_is_waited_for() {
    // The input is copied in asynchronously (pinned host → device) right
    // before the call, and the result copied out asynchronously right
    // after; only then does the test synchronize. The fake stream delays
    // the copies, so a stager that read too early would see stale data.
    ranks(2, |r, comm, s, st| {
        let c = 5000;
        let mut pin = Pinned::<i32>::new(c);
        pin.slice()
            .copy_from_slice(&(0..c).map(|i| val(r, i)).collect::<Vec<_>>());
        let dev = Dev::<i32>::zeros(c, s);
        for round in 0..3 {
            pin.upload(&dev, s);
            let args = RawArgs {
                coll: RawColl::AllReduce,
                send: dev.ptr(),
                recv: dev.ptr(),
                count: c,
                dtype: DataType::Int32,
                op: RedOp::Sum,
                root: 0,
            };
            // SAFETY: a device buffer of `c` elements.
            unsafe { st.collective(comm, &args, s.id(), None) }.unwrap();
            pin.download(&dev, s);
            s.sync();
            let got = pin.slice().to_vec();
            let want: Vec<i32> = (0..c)
                .map(|i| (val(0, i) + val(1, i)) * (1 << round))
                .collect();
            same(&got, &want, &format!("rank {r} round {round}"));
            // Next round: both ranks feed the sum back in, doubling it.
        }
    });
}

#[test]
fn premultiplied_input_on_device() {
    ranks(2, |r, comm, s, st| {
        let c = 2000;
        let x: Vec<i32> = (0..c).map(|i| val(r, i)).collect();
        let send = Dev::from(&x, s);
        let recv = Dev::<i32>::zeros(c, s);
        let args = RawArgs {
            coll: RawColl::AllReduce,
            send: send.ptr(),
            recv: recv.ptr(),
            count: c,
            dtype: DataType::Int32,
            op: RedOp::Sum,
            root: 0,
        };
        let scalar = 3i32.to_ne_bytes();
        // SAFETY: device buffers of `c` elements.
        unsafe { st.collective(comm, &args, s.id(), Some(&scalar)) }.unwrap();
        let want: Vec<i32> = (0..c).map(|i| 3 * (val(0, i) + val(1, i))).collect();
        same(&recv.read(s), &want, "PreMulSum");
        // The input itself is untouched.
        same(&send.read(s), &x, "PreMulSum input");
    });
}

#[test]
fn host_buffers_take_the_ordinary_path() {
    ranks(2, |r, comm, _s, st| {
        let x = vec![r as f64 + 0.5; 100];
        let mut y = vec![0.0f64; 100];
        let args = RawArgs {
            coll: RawColl::AllReduce,
            send: x.as_ptr().cast(),
            recv: y.as_mut_ptr().cast(),
            count: 100,
            dtype: DataType::Float64,
            op: RedOp::Sum,
            root: 0,
        };
        // SAFETY: host buffers of 100 f64.
        unsafe { st.collective(comm, &args, nccl_rs::cuda::Stream::DEFAULT, None) }.unwrap();
        assert_eq!(y, vec![2.0; 100]);
    });
}
