//! The halving-doubling all-reduce on real engines over the in-memory
//! transport, many ranks driven by one thread (as in `engine::tests`): exact
//! integer sums at power-of-two and other world sizes, in place and out of
//! place, and bit-identical float averages on every rank. Unit tests: the
//! engine is crate-private. (The symbolic schedule runs are integration
//! tests: `nccl-rs/tests/schedule/`.)

use super::all_reduce_halving_doubling;
use crate::datatype::{DataType, RedOp};
use crate::engine::Region;
use crate::testing::{drive_engines, engine_mesh};
use crate::transport::mem::MemNet;

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
    let mut engines = engine_mesh(&MemNet::new(), n, slot);
    let chunk = slot / dtype.size();
    let scheds: Vec<_> = (0..n)
        .map(|r| all_reduce_halving_doubling(n, r, count, chunk))
        .collect();
    let regions = bufs
        .iter_mut()
        .map(|(i, o)| {
            let output = Region::new(o.as_mut_ptr().cast(), bytes);
            let input = if in_place {
                output
            } else {
                Region::read_only(i.as_ptr().cast(), bytes)
            };
            (input, output)
        })
        .collect();
    let what = format!("n={n} count={count}");
    drive_engines(&mut engines, &scheds, dtype, op, regions, &what);
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
