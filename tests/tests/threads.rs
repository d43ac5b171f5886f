//! Ranks as threads of one process, over TCP and over the in-memory
//! transport: async collectives, comm split, abort, argument errors.

use nccl_rs::testing::{self, Over};
use nccl_rs::{Communicator, Config, Error, RedOp, UniqueId};
use std::time::Duration;

fn config() -> Config {
    testing::loopback(Duration::from_secs(30))
}

/// Runs `f(comm)` on `n` ranks as threads (over the in-memory transport
/// if `mem`) and returns their results.
fn on_threads<R: Send>(n: usize, mem: bool, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    on_threads_with(n, mem, |_| {}, f)
}

/// [`on_threads`] with the configuration changed by `tune` first.
fn on_threads_with<R: Send>(
    n: usize,
    mem: bool,
    tune: impl FnOnce(&mut Config),
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    let mut cfg = config();
    tune(&mut cfg);
    let over = if mem { Over::Mem } else { Over::Config };
    testing::on_threads(n, &cfg, over, |_, comm| f(comm))
}

#[test]
fn async_all_reduces_complete_in_issue_order() {
    let outs = on_threads(4, false, |mut comm| {
        let r = comm.rank() as f32;
        let ops: Vec<_> = (0..5)
            .map(|k| {
                comm.all_reduce_async(vec![r + k as f32; 1000 + k], RedOp::Sum)
                    .unwrap()
            })
            .collect();
        // A blocking call after async ones runs after them.
        let mut b = vec![1u32; 3];
        comm.all_reduce_in_place(&mut b, RedOp::Sum).unwrap();
        assert_eq!(b, vec![4; 3]);
        let mut results = Vec::new();
        for (k, op) in ops.into_iter().enumerate() {
            assert!(op.is_done());
            let v = op.wait().unwrap();
            assert_eq!(v.len(), 1000 + k);
            results.push(v[0]);
        }
        // Dropped without waiting: waited for, never leaked.
        let dropped = comm.all_reduce_async(vec![1i64; 10], RedOp::Sum).unwrap();
        drop(dropped);
        let op = comm.all_reduce_async(vec![2u8; 4], RedOp::Max).unwrap();
        let v = op
            .wait_timeout(Duration::from_secs(20))
            .ok()
            .unwrap()
            .unwrap();
        assert_eq!(v, vec![2u8; 4]);
        results
    });
    for res in outs {
        assert_eq!(res, (0..5).map(|k| (6 + 4 * k) as f32).collect::<Vec<_>>());
    }
}

#[test]
fn async_gather_scatter_forms() {
    on_threads(3, true, |mut comm| {
        let (r, n) = (comm.rank(), comm.size());
        let mut buf = vec![0u32; 3 * n];
        buf[3 * r..3 * r + 3].fill(r as u32 + 1);
        let buf = comm.all_gather_async(buf).unwrap().wait().unwrap();
        assert_eq!(
            buf,
            (0..3 * n).map(|i| (i / 3) as u32 + 1).collect::<Vec<_>>()
        );
        let rs = comm
            .reduce_scatter_async(vec![1i32; 2 * n], RedOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(&rs[2 * r..2 * r + 2], &[n as i32; 2]);
        let b = comm
            .broadcast_async(vec![r as u64; 5], 2)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(b, vec![2; 5]);
    });
}

#[test]
fn mem_transport_16_ranks_all_collectives_smoke() {
    on_threads(16, true, |mut comm| {
        let (r, n) = (comm.rank(), comm.size());
        let mut out = vec![0i32; 33];
        comm.all_reduce(&[r as i32; 33], &mut out, RedOp::Sum)
            .unwrap();
        assert_eq!(out, vec![(n * (n - 1) / 2) as i32; 33]);
        let mut g = vec![0u8; 2 * n];
        comm.all_gather(&[r as u8; 2], &mut g).unwrap();
        assert_eq!(g, (0..2 * n).map(|i| (i / 2) as u8).collect::<Vec<_>>());
        comm.barrier().unwrap();
    });
}

#[test]
fn split_by_parity_then_collective() {
    on_threads(5, false, |mut comm| {
        let r = comm.rank();
        let cfg = config();
        let color = if r == 4 { None } else { Some((r % 2) as u32) };
        let sub = comm.split(color, -(r as i32), &cfg).unwrap();
        match sub {
            None => assert_eq!(r, 4),
            Some(mut sub) => {
                // key = -rank: the new ranks are in reverse order.
                let members: Vec<usize> = (0..4).filter(|x| x % 2 == r % 2).rev().collect();
                assert_eq!(sub.size(), members.len());
                assert_eq!(members[sub.rank()], r);
                let mut v = [r as u32];
                sub.all_reduce_in_place(&mut v, RedOp::Sum).unwrap();
                assert_eq!(v[0], members.iter().map(|&m| m as u32).sum::<u32>());
            }
        }
    });
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    on_threads(2, true, |mut comm| {
        let mut out = vec![0f32; 3];
        assert!(matches!(
            comm.all_reduce(&[1.0f32; 4], &mut out, RedOp::Sum),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            comm.broadcast_in_place(&mut out, 7),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            comm.all_gather(&[1u8; 2], &mut [0u8; 3]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            comm.reduce_scatter_in_place(&mut [0u8; 3], RedOp::Sum),
            Err(Error::InvalidArgument(_))
        ));
        assert!(
            matches!(
                comm.send(&[1u8], comm.rank()),
                Err(Error::InvalidArgument(_))
            ),
            "unpaired send to self"
        );
        assert!(matches!(
            comm.send(&[1u8], 9),
            Err(Error::InvalidArgument(_))
        ));
        let (a, mut b) = ([7u8; 3], [0u8; 3]);
        let me = comm.rank();
        let mut g = nccl_rs::P2pGroup::new();
        g.send(&a, me);
        g.recv(&mut b, me);
        comm.run_group(g).unwrap();
        assert_eq!(b, a);
        // The communicator is still usable after argument errors.
        comm.barrier().unwrap();
    });
    assert!(matches!(
        Communicator::init(
            &UniqueId::from_addr_str("127.0.0.1:1").unwrap(),
            2,
            5,
            &config()
        ),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn abort_unblocks_a_stuck_collective() {
    on_threads(2, false, |mut comm| {
        if comm.rank() == 1 {
            // Rank 1 never joins the all-reduce; it aborts rank 0 instead.
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        let h = comm.abort_handle();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            h.abort();
        });
        let start = std::time::Instant::now();
        let mut v = vec![1.0f32; 8];
        let err = comm.all_reduce_in_place(&mut v, RedOp::Sum).unwrap_err();
        assert!(
            matches!(err, Error::Aborted { .. } | Error::Transport { .. }),
            "{err}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        t.join().unwrap();
        assert!(matches!(
            comm.barrier(),
            Err(Error::Poisoned { .. }) | Err(Error::Aborted { .. })
        ));
    });
}

#[test]
fn broadcast_message_cuts_agree_when_settings_differ_per_rank() {
    // Rank 1 has another single-copy cap than rank 0: were their plans
    // to differ, a root could send its broadcast as one message while the
    // other rank cuts it in chunks; the ranks agree at init on one set of
    // topology facts (single copy off when any differs). Both roots, in
    // place and out of place.
    let cfg = config();
    let id = UniqueId::new(&cfg).unwrap();
    let n = 2;
    let count = 4 << 20; // 16 MiB of u32: 32 chunks
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let mut cfg = cfg.clone();
            if r == 1 {
                cfg.shm_cma_max_bytes = 1 << 20;
            }
            std::thread::spawn(move || {
                let mut comm = Communicator::init(&id, n, r, &cfg).unwrap();
                for root in 0..n {
                    let want = |i: usize| (root * count + i) as u32 ^ 0x5a5a_0000;
                    let send: Vec<u32> = (0..count).map(want).collect();
                    let mut recv = vec![0u32; count];
                    comm.broadcast(&send, &mut recv, root).unwrap();
                    assert!(
                        recv.iter().enumerate().all(|(i, &v)| v == want(i)),
                        "root {root}"
                    );
                    let mut buf = if r == root { send } else { vec![0u32; count] };
                    comm.broadcast_in_place(&mut buf, root).unwrap();
                    assert!(
                        buf.iter().enumerate().all(|(i, &v)| v == want(i)),
                        "root {root} in place"
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn all_to_all_message_cuts_agree_when_single_copy_differs_per_rank() {
    // Rank 0 has single copy off, rank 1 on: whole-block all-to-all would
    // cut rank 1's messages unlike rank 0's receives (a size mismatch);
    // the ranks agree at init to send in chunks instead.
    let cfg = config();
    let id = UniqueId::new(&cfg).unwrap();
    let n = 2;
    let count = 2 << 20; // u32 per peer: 8 MiB blocks, 16 chunks each
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let mut cfg = cfg.clone();
            cfg.shm_use_cma = r == 1;
            std::thread::spawn(move || {
                let mut comm = Communicator::init(&id, n, r, &cfg).unwrap();
                let send: Vec<u32> = (0..n * count).map(|i| (r * n * count + i) as u32).collect();
                let mut recv = vec![0u32; n * count];
                comm.all_to_all(&send, &mut recv).unwrap();
                for p in 0..n {
                    for i in [0, 1, count / 2, count - 1] {
                        let want = (p * n * count + r * count + i) as u32;
                        assert_eq!(recv[p * count + i], want, "rank {r} from {p} at {i}");
                    }
                }
                assert!(recv
                    .iter()
                    .enumerate()
                    .all(|(k, &v)| v == ((k / count) * n * count + r * count + k % count) as u32));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// All-to-alls of each of `counts` elements per peer on `comm`, in place if
/// `in_place`, checked exactly; the mismatches found.
fn mixed_all_to_alls(comm: &mut Communicator, in_place: bool, counts: &[usize]) -> Vec<String> {
    let (n, r) = (comm.size(), comm.rank());
    let mut fails = Vec::new();
    for &count in counts {
        // Element i of rank r's input: block i / count, going to that rank.
        let input: Vec<u32> = (0..n * count).map(|i| (r * n * count + i) as u32).collect();
        let want = |i: usize| ((i / count) * n * count + r * count + i % count) as u32;
        let out = if in_place {
            let mut buf = input;
            comm.all_to_all_in_place(&mut buf).unwrap();
            buf
        } else {
            let mut out = vec![0u32; n * count];
            comm.all_to_all(&input, &mut out).unwrap();
            out
        };
        if let Some(i) = (0..n * count).find(|&i| out[i] != want(i)) {
            fails.push(format!(
                "count {count} element {i}: {} != {}",
                out[i],
                want(i)
            ));
        }
    }
    fails
}

#[test]
fn all_to_all_ranks_in_place_and_out_of_place_mix() {
    // An in-place rank copies only the blocks it sends and leaves its own
    // block where it is; its messages must still match those of the ranks
    // out of place. Even ranks in place; 3 ranks so that every rank both
    // sends to and receives from both kinds. Sizes: below and above the
    // engine's chunk, and single-copy whole blocks on shared memory.
    for (mem, shm) in [(true, false), (false, true), (false, false)] {
        let outs = on_threads_with(
            3,
            mem,
            move |c| c.shm_disable = !shm,
            move |mut comm| {
                let in_place = comm.rank() % 2 == 0;
                mixed_all_to_alls(&mut comm, in_place, &[1, 1000, 300_000, 2 << 20])
            },
        );
        for (r, fails) in outs.iter().enumerate() {
            assert!(fails.is_empty(), "mem={mem} shm={shm} rank {r}: {fails:?}");
        }
    }
}

#[test]
fn pair_all_to_all_mixes_in_place_and_out_of_place_under_the_placement_probe() {
    // Two ranks on shared memory measure their CPUs' placement before an
    // all-to-all from `shm_stream_bytes` (4 KiB here), and an out-of-place
    // one found near takes the ring in chunks, where one in place keeps
    // whole blocks: the probe trades that, so a rank in place and one out
    // of place still cut their messages alike. Measured, and fixed near,
    // apart and unknown.
    use nccl_rs::{Placement, PlacementMode};
    for mode in [
        PlacementMode::Adaptive,
        PlacementMode::Fixed(Placement::Near),
        PlacementMode::Fixed(Placement::Apart),
        PlacementMode::Fixed(Placement::Unknown),
    ] {
        for in_place_rank in [0, 1] {
            let outs = on_threads_with(
                2,
                false,
                move |c| {
                    c.shm_stream_bytes = Some(4096);
                    c.placement = mode;
                },
                move |mut comm| {
                    let in_place = comm.rank() == in_place_rank;
                    mixed_all_to_alls(&mut comm, in_place, &[512, 300_000, 2 << 20])
                },
            );
            for (r, fails) in outs.iter().enumerate() {
                assert!(
                    fails.is_empty(),
                    "{mode:?}, rank {in_place_rank} in place, rank {r}: {fails:?}"
                );
            }
        }
    }
}

#[test]
fn zero_copy_all_to_all_in_place_swaps_and_mixed_calls_fall_back() {
    // Shared buffers on every rank (ranks as threads share one process; the
    // zero-copy path maps the buffers all the same). All ranks in place:
    // the ranks swap blocks pairwise; some in place: every rank falls
    // back to the transport. Exact either way, at sizes around the swap's
    // halves (odd counts split unevenly).
    let n = 3;
    let outs = on_threads_with(
        n,
        false,
        |c| c.zero_copy_min_bytes = 1,
        move |mut comm| {
            let r = comm.rank();
            let mut fails = Vec::new();
            for count in [1usize, 7, 1000, 100_001] {
                let value = |rank: usize, i: usize| (rank * n * count + i) as u32;
                let want = |i: usize| value(i / count, r * count + i % count);
                for all_in_place in [true, false] {
                    let mut buf = nccl_rs::ShmBuffer::<u32>::zeroed(n * count).unwrap();
                    for (i, x) in buf.iter_mut().enumerate() {
                        *x = value(r, i);
                    }
                    let out = if all_in_place || r % 2 == 0 {
                        comm.all_to_all_in_place(&mut buf).unwrap();
                        buf.to_vec()
                    } else {
                        let mut out = nccl_rs::ShmBuffer::<u32>::zeroed(n * count).unwrap();
                        comm.all_to_all(&buf, &mut out).unwrap();
                        out.to_vec()
                    };
                    if let Some(i) = (0..n * count).find(|&i| out[i] != want(i)) {
                        fails.push(format!(
                            "count {count} all_in_place {all_in_place}: element {i} {} != {}",
                            out[i],
                            want(i)
                        ));
                    }
                }
            }
            fails
        },
    );
    for (r, fails) in outs.iter().enumerate() {
        assert!(fails.is_empty(), "rank {r}: {fails:?}");
    }
}

#[test]
fn async_collectives_take_shared_buffers() {
    // `ShmBuffer` is `AsMut<[T]>`, so the async calls take it (and hand it
    // back), and on shared buffers they run zero-copy like blocking ones.
    let n = 3;
    let outs = on_threads_with(
        n,
        false,
        |c| c.zero_copy_min_bytes = 1,
        move |mut comm| {
            let r = comm.rank() as u64;
            let count = 10_000;
            let mut a = nccl_rs::ShmBuffer::<u64>::zeroed(count).unwrap();
            for (i, x) in a.iter_mut().enumerate() {
                *x = r * 1_000_000 + i as u64;
            }
            let mut g = nccl_rs::ShmBuffer::<u64>::zeroed(n * count).unwrap();
            for (i, x) in g[r as usize * count..][..count].iter_mut().enumerate() {
                *x = r << 32 | i as u64;
            }
            let a = comm.all_reduce_async(a, RedOp::Sum).unwrap();
            let g = comm.all_gather_async(g).unwrap();
            let (a, g) = (a.wait().unwrap(), g.wait().unwrap());
            let sum_ok = a
                .iter()
                .enumerate()
                .all(|(i, &x)| x == 3_000_000 + 3 * i as u64);
            let gather_ok = g
                .iter()
                .enumerate()
                .all(|(j, &x)| x == ((j / count) as u64) << 32 | (j % count) as u64);
            (sum_ok, gather_ok)
        },
    );
    assert!(outs.iter().all(|&o| o == (true, true)), "{outs:?}");
}

#[test]
fn raw_async_calls_hand_back_their_keep_with_the_result() {
    use nccl_rs::comm::raw::{RawArgs, RawColl, RawP2p};
    use nccl_rs::DataType;
    on_threads(3, true, |mut comm| {
        let (r, n) = (comm.rank(), comm.size());
        // Out-of-place all-gather: the buffers live in `keep`.
        let send = vec![r as u32 + 1; 2].into_boxed_slice();
        let mut recv = vec![0u32; 2 * n].into_boxed_slice();
        let a = RawArgs {
            coll: RawColl::AllGather,
            send: send.as_ptr().cast(),
            recv: recv.as_mut_ptr().cast(),
            count: 2,
            dtype: DataType::Uint32,
            op: RedOp::Sum,
            root: 0,
        };
        // SAFETY: both boxes move into the operation and come back from wait.
        let op = unsafe { comm.collective_raw_async(&a, (send, recv)) }.unwrap();
        let ((_, recv), res) = op.wait().unwrap();
        res.unwrap();
        assert_eq!(
            &*recv,
            &(0..2 * n).map(|i| (i / 2) as u32 + 1).collect::<Vec<_>>()[..]
        );
        // A ring of sends and receives in the background.
        let out = vec![r as u8; 4].into_boxed_slice();
        let mut inp = vec![0u8; 4].into_boxed_slice();
        let ops = [
            RawP2p {
                is_send: true,
                peer: (r + 1) % n,
                ptr: out.as_ptr() as *mut u8,
                bytes: 4,
            },
            RawP2p {
                is_send: false,
                peer: (r + n - 1) % n,
                ptr: inp.as_mut_ptr(),
                bytes: 4,
            },
        ];
        // SAFETY: as above.
        let op = unsafe { comm.run_group_raw_async(&ops, (out, inp)) }.unwrap();
        let ((_, inp), res) = op.wait().unwrap();
        res.unwrap();
        assert_eq!(&*inp, &[((r + n - 1) % n) as u8; 4]);
        // A bad argument is refused before anything is queued.
        let bad = RawArgs {
            root: n,
            coll: RawColl::Broadcast,
            ..a
        };
        // SAFETY: refused before any pointer is used.
        assert!(matches!(
            unsafe { comm.collective_raw_async(&bad, ()) },
            Err(Error::InvalidArgument(_))
        ));
    });
}
