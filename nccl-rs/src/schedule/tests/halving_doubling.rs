//! Tests of the halving-doubling all-reduce: symbolic runs at every world
//! size 1..=64, then real engines over the in-memory transport, many ranks
//! driven by one thread (as in `engine::tests`): exact integer sums at
//! power-of-two and other world sizes, in place and out of place, and
//! bit-identical float averages on every rank.

use super::{all, expect, run, v};
use crate::datatype::{DataType, RedOp};
use crate::engine::{CallBufs, Engine, OpLabel, Region};
use crate::schedule::check::{simulate, SymBufs, Val};
use crate::schedule::{all_reduce_halving_doubling, Loc, Step};
use crate::transport::mem::MemNet;
use crate::transport::{Net, RecvComm, SendComm};
use std::time::Duration;

#[test]
fn halving_doubling_all_reduce_every_element_reduced_once() {
    // Every world size 1..=64 (powers of two and not), counts below, at and
    // above the number of ranks, not divisible by the core size.
    for n in 1..=64 {
        for c in [0, 1, 5, n - 1, n + 3, 64, 1023] {
            for ch in [1, 3, 64, 1 << 20] {
                let b = run(
                    n,
                    |r| all_reduce_halving_doubling(n, r, c, ch),
                    |r| (0..c).map(|i| v(r, i)).collect(),
                    c,
                );
                for (r, bufs) in b.iter().enumerate() {
                    expect(
                        &bufs.output,
                        |i| Val {
                            ranks: all(n),
                            index: i as u64,
                        },
                        &format!("halving-doubling n={n} c={c} ch={ch} rank {r}"),
                    );
                }
            }
        }
    }
}

#[test]
fn halving_doubling_chunks_fit_a_slot_and_finalize_once() {
    for n in [2, 3, 6, 8, 13] {
        for r in 0..n {
            let s = all_reduce_halving_doubling(n, r, 1000, 7);
            assert!(s.steps.iter().all(|x| x.count() <= 7), "n={n} rank {r}");
            assert_eq!(s.scratch, 0);
        }
        // Each element is finalized exactly once, by its owner.
        let mut finalized = vec![0; 1000];
        for r in 0..n {
            for step in all_reduce_halving_doubling(n, r, 1000, 7).steps {
                if let Step::RecvReduceCopySend {
                    finalize: true,
                    dst: Loc::Out(o),
                    count,
                    ..
                } = step
                {
                    finalized[o..o + count].iter_mut().for_each(|f| *f += 1);
                }
            }
        }
        assert!(finalized.iter().all(|&f| f == 1), "n={n}");
    }
}

#[test]
fn a_broken_halving_doubling_schedule_is_caught() {
    // 6 ranks: rank 1 is the fold partner of extra rank 0. Dropping the
    // first result it sends back, or not forwarding its own block to the
    // partner, must fail the check.
    let (n, c) = (6, 37);
    let good: Vec<_> = (0..n)
        .map(|r| all_reduce_halving_doubling(n, r, c, 4))
        .collect();
    let bufs = || -> Vec<SymBufs> {
        (0..n)
            .map(|r| SymBufs {
                input: (0..c).map(|i| v(r, i)).collect(),
                output: vec![None; c],
                scratch: vec![],
            })
            .collect()
    };
    simulate(&good, &mut bufs()).unwrap();
    let mut dropped = good.clone();
    let i = dropped[1]
        .steps
        .iter()
        .position(|s| s.send_peer() == Some(0))
        .unwrap();
    dropped[1].steps.remove(i);
    assert!(simulate(&dropped, &mut bufs()).is_err());
    let mut unforwarded = good;
    for s in &mut unforwarded[1].steps {
        if let Step::RecvReduceCopySend {
            finalize: true, to, ..
        } = s
        {
            *to = None;
        }
    }
    assert!(simulate(&unforwarded, &mut bufs()).is_err());
}

fn mesh(n: usize, slot_bytes: usize) -> Vec<Engine> {
    let net = MemNet::new();
    let mut send: Vec<Vec<Option<Box<dyn SendComm>>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    let mut recv: Vec<Vec<Option<Box<dyn RecvComm>>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for a in 0..n {
        for b in 0..n {
            if a != b {
                let mut l = net.listen().unwrap();
                let mut c = net.connect(l.handle()).unwrap();
                send[a][b] = c.poll_connect().unwrap();
                recv[b][a] = l.accept().unwrap();
            }
        }
    }
    send.into_iter()
        .zip(recv)
        .enumerate()
        .map(|(r, (s, v))| Engine::new(r, n, s, v, slot_bytes, 4, Duration::from_secs(5)))
        .collect()
}

/// Runs a halving-doubling all-reduce of `count` elements on every rank.
/// `bufs[r]` is `(input, output)`; with `in_place` the output is also the
/// input.
fn drive<T: bytemuck::Pod>(
    n: usize,
    count: usize,
    dtype: DataType,
    op: RedOp,
    bufs: &mut [(Vec<T>, Vec<T>)],
    in_place: bool,
) {
    let bytes = count * dtype.size();
    let slot = 64;
    let mut engines = mesh(n, slot);
    let chunk = slot / dtype.size();
    let scheds: Vec<_> = (0..n)
        .map(|r| all_reduce_halving_doubling(n, r, count, chunk))
        .collect();
    let mut runs: Vec<_> = engines
        .iter_mut()
        .zip(&scheds)
        .zip(bufs.iter_mut())
        .map(|((e, s), (i, o))| {
            let output = Region::new(o.as_mut_ptr().cast(), bytes);
            let input = if in_place {
                output
            } else {
                Region::read_only(i.as_ptr().cast(), bytes)
            };
            let call = crate::engine::Call {
                sched: s,
                dtype,
                op,
                tag: 1,
                what: OpLabel::Test,
                hints: Default::default(),
            };
            let bufs = CallBufs {
                input,
                output,
                group: vec![],
            };
            e.start(call, bufs)
        })
        .collect();
    let mut done = vec![false; n];
    for _ in 0..1_000_000 {
        for (r, run) in runs.iter_mut().enumerate() {
            if !done[r] {
                done[r] = run.poll().unwrap().0;
            }
        }
        if done.iter().all(|d| *d) {
            return;
        }
    }
    panic!("n={n} count={count}: did not finish within the step bound");
}

#[test]
fn integer_sums_are_exact_at_many_world_sizes() {
    for n in [1, 2, 3, 5, 6, 7, 8, 12, 16] {
        for count in [0, 1, n - 1, 37, 1000] {
            for in_place in [false, true] {
                let value = |r: usize, i: usize| ((r * 7919 + i * 31) % 100_003) as i64 - 50_000;
                let mut bufs: Vec<_> = (0..n)
                    .map(|r| {
                        let input: Vec<i64> = (0..count).map(|i| value(r, i)).collect();
                        let output = if in_place {
                            input.clone()
                        } else {
                            vec![0; count]
                        };
                        (input, output)
                    })
                    .collect();
                drive(n, count, DataType::Int64, RedOp::Sum, &mut bufs, in_place);
                let want: Vec<i64> = (0..count)
                    .map(|i| (0..n).map(|r| value(r, i)).sum())
                    .collect();
                for (r, (_, out)) in bufs.iter().enumerate() {
                    assert_eq!(
                        out, &want,
                        "n={n} count={count} in_place={in_place} rank {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn float_average_is_bit_identical_on_every_rank() {
    for n in [3, 6, 8] {
        let count = 101;
        let value = |r: usize, i: usize| (r as f32 + 1.0) * 0.1 + i as f32 * 0.37;
        let mut bufs: Vec<_> = (0..n)
            .map(|r| {
                let input: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
                (input, vec![0.0f32; count])
            })
            .collect();
        drive(n, count, DataType::Float32, RedOp::Avg, &mut bufs, false);
        let first = bufs[0].1.clone();
        for (i, g) in first.iter().enumerate() {
            let want = (0..n).map(|r| value(r, i)).sum::<f32>() / n as f32;
            assert!(
                (g - want).abs() <= 1e-5 * want.abs().max(1.0),
                "n={n} element {i}: {g} vs {want}"
            );
        }
        for (r, (_, out)) in bufs.iter().enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(out),
                bits(&first),
                "n={n}: rank {r} differs in bits from rank 0"
            );
        }
    }
}
