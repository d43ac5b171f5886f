//! Engines of many ranks driven by one thread over the in-memory transport:
//! deterministic, no sockets, no threads, bounded step count.

use super::*;
use crate::datatype::{DataType, RedOp};
use crate::schedule::{self, Schedule};
use crate::testing::{drive_engines, engine_mesh, test_call};
use crate::transport::mem::MemNet;

fn mesh(n: usize, slot_bytes: usize) -> Vec<Engine> {
    engine_mesh(&MemNet::new(), n, slot_bytes)
}

/// Runs one operation on every rank, round-robin, in one thread.
fn drive(
    engines: &mut [Engine],
    scheds: &[Schedule],
    dtype: DataType,
    op: RedOp,
    io: &mut [(Vec<u8>, Vec<u8>)],
) {
    let bufs = io
        .iter_mut()
        .map(|(i, o)| {
            (
                Region::read_only(i.as_ptr(), i.len()),
                Region::new(o.as_mut_ptr(), o.len()),
            )
        })
        .collect();
    drive_engines(engines, scheds, dtype, op, bufs, "operation");
}

fn f32s(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

#[test]
fn all_reduce_64_ranks_exact() {
    for (n, count, slot) in [
        (64, 1000, 64),
        (7, 1023, 16),
        (2, 1, 64),
        (1, 5, 64),
        (16, 100003, 4096),
    ] {
        let mut engines = mesh(n, slot);
        let chunk = slot / 4;
        let scheds: Vec<_> = (0..n)
            .map(|r| schedule::all_reduce(n, r, count, chunk))
            .collect();
        let mut io: Vec<_> = (0..n)
            .map(|r| {
                let input: Vec<f32> = (0..count).map(|i| ((r * 7 + i * 3) % 11) as f32).collect();
                (f32s(&input), vec![0u8; count * 4])
            })
            .collect();
        drive(
            &mut engines,
            &scheds,
            DataType::Float32,
            RedOp::Sum,
            &mut io,
        );
        let want: Vec<f32> = (0..count)
            .map(|i| (0..n).map(|r| ((r * 7 + i * 3) % 11) as f32).sum())
            .collect();
        for (r, (_, out)) in io.iter().enumerate() {
            assert_eq!(out, &f32s(&want), "n={n} count={count} rank {r}");
        }
    }
}

/// Over shared memory the reduction reads the peer's data where it lies in
/// the ring (lent, in two pieces where it wraps) instead of a staging slot.
#[test]
fn all_reduce_over_shm_reduces_from_the_ring() {
    use crate::transport::shm::{ShmNet, ShmOptions};
    // Rings of 5 slots of 1 KiB, messages of up to 1 KiB + a header line:
    // frames wrap at every position; 200-byte chunks leave odd tails.
    let net = ShmNet::new(ShmOptions {
        buffsize: 5 << 10,
        slots: 5,
        ..ShmOptions::default()
    })
    .unwrap();
    for (n, count, slot) in [(2, 100_003, 1024), (3, 4099, 1024), (4, 777, 200)] {
        let mut engines = engine_mesh(&net, n, slot);
        let scheds: Vec<_> = (0..n)
            .map(|r| schedule::all_reduce(n, r, count, slot / 4))
            .collect();
        let mut io: Vec<_> = (0..n)
            .map(|r| {
                let input: Vec<i32> = (0..count).map(|i| (r * 31 + i * 7) as i32 - 500).collect();
                (bytemuck::cast_slice(&input).to_vec(), vec![0u8; count * 4])
            })
            .collect();
        drive(&mut engines, &scheds, DataType::Int32, RedOp::Sum, &mut io);
        let want: Vec<i32> = (0..count)
            .map(|i| (0..n).map(|r| (r * 31 + i * 7) as i32 - 500).sum())
            .collect();
        for (r, (_, out)) in io.iter().enumerate() {
            assert!(
                out[..] == *bytemuck::cast_slice::<i32, u8>(&want),
                "n={n} count={count} rank {r}"
            );
        }
    }
}

#[test]
fn reduce_scatter_and_all_gather_32_ranks() {
    let (n, c) = (32, 37);
    let mut engines = mesh(n, 32);
    let scheds: Vec<_> = (0..n)
        .map(|r| schedule::reduce_scatter(n, r, c, 8))
        .collect();
    let mut io: Vec<_> = (0..n)
        .map(|r| {
            (
                f32s(&(0..n * c).map(|i| (r + i % 5) as f32).collect::<Vec<_>>()),
                vec![0u8; c * 4],
            )
        })
        .collect();
    drive(
        &mut engines,
        &scheds,
        DataType::Float32,
        RedOp::Max,
        &mut io,
    );
    for (r, (_, out)) in io.iter().enumerate() {
        let want: Vec<f32> = (0..c).map(|i| ((n - 1) + (r * c + i) % 5) as f32).collect();
        assert_eq!(out, &f32s(&want), "rank {r}");
    }
    let scheds: Vec<_> = (0..n).map(|r| schedule::all_gather(n, r, c, 8)).collect();
    let mut io: Vec<_> = (0..n)
        .map(|r| {
            (
                f32s(&(0..c).map(|i| (r * 1000 + i) as f32).collect::<Vec<_>>()),
                vec![0u8; n * c * 4],
            )
        })
        .collect();
    drive(
        &mut engines,
        &scheds,
        DataType::Float32,
        RedOp::Sum,
        &mut io,
    );
    let want: Vec<f32> = (0..n * c)
        .map(|i| ((i / c) * 1000 + i % c) as f32)
        .collect();
    for (_, out) in &io {
        assert_eq!(out, &f32s(&want));
    }
}

#[test]
fn avg_divides_once_and_ranks_agree_bitwise() {
    let (n, count) = (5, 101);
    let mut engines = mesh(n, 64);
    let scheds: Vec<_> = (0..n)
        .map(|r| schedule::all_reduce(n, r, count, 16))
        .collect();
    let mut io: Vec<_> = (0..n)
        .map(|r| {
            (
                f32s(&(0..count).map(|i| (r + i) as f32 * 0.1).collect::<Vec<_>>()),
                vec![0u8; count * 4],
            )
        })
        .collect();
    drive(
        &mut engines,
        &scheds,
        DataType::Float32,
        RedOp::Avg,
        &mut io,
    );
    let first = io[0].1.clone();
    let got: &[f32] = bytemuck::cast_slice(&first);
    for (i, g) in got.iter().enumerate() {
        let want = (0..n).map(|r| (r + i) as f32 * 0.1).sum::<f32>() / n as f32;
        assert!(
            (g - want).abs() <= 1e-5 * want.abs().max(1.0),
            "element {i}: {g} vs {want}"
        );
    }
    for (_, out) in &io {
        assert_eq!(out, &first, "every rank must hold the same bits");
    }
}

/// Tiny calls take the transport's eager path where it has one (every
/// message within its limit), and compute what the request path computes,
/// exactly; calls with a larger message, or over a transport without the
/// path, do not take it.
#[test]
fn tiny_calls_take_the_eager_path_and_agree() {
    type Build = fn(usize, usize, usize) -> Schedule;
    type Elems = fn(usize) -> (usize, usize);
    // (name, schedule of (n, r, count), input and output elements per
    // `count` at n ranks)
    let cases: [(&str, Build, Elems); 7] = [
        ("all-reduce direct", schedule::all_reduce_direct, |_| (1, 1)),
        (
            "all-reduce ring",
            |n, r, c| schedule::all_reduce(n, r, c, 2),
            |_| (1, 1),
        ),
        (
            "reduce-scatter direct",
            schedule::reduce_scatter_direct,
            |n| (n, 1),
        ),
        ("all-gather direct", schedule::all_gather_direct, |n| (1, n)),
        (
            "broadcast direct",
            |n, r, c| schedule::broadcast_direct(n, r, n - 1, c),
            |_| (1, 1),
        ),
        (
            "all-to-all",
            |n, r, c| schedule::all_to_all(n, r, c, 3),
            |n| (n, n),
        ),
        (
            "tree all-reduce",
            |n, r, c| schedule::all_reduce_tree(n, r, c, 2),
            |_| (1, 1),
        ),
    ];
    let run = |net: &MemNet, n: usize, build: Build, count: usize, (i, o): (usize, usize)| {
        let mut engines = engine_mesh(net, n, 64);
        let scheds: Vec<_> = (0..n).map(|r| build(n, r, count)).collect();
        let eager: Vec<bool> = engines
            .iter()
            .zip(&scheds)
            .map(|(e, s)| e.eager(&test_call(s, DataType::Int32, RedOp::Sum)))
            .collect();
        let mut io: Vec<_> = (0..n)
            .map(|r| {
                let input: Vec<i32> = (0..i * count).map(|k| (r * 1000 + k) as i32).collect();
                (
                    bytemuck::cast_slice(&input).to_vec(),
                    vec![0u8; o * count * 4],
                )
            })
            .collect();
        drive(&mut engines, &scheds, DataType::Int32, RedOp::Sum, &mut io);
        (
            eager,
            io.into_iter().map(|(_, out)| out).collect::<Vec<_>>(),
        )
    };
    for n in [2, 3, 5, 8] {
        for (name, build, elems) in cases {
            // Messages of at most 48 bytes (12 elements) go eager.
            for count in [3, 12, 13] {
                let (e_on, out_on) = run(&MemNet::with_eager(48), n, build, count, elems(n));
                let (e_off, out_off) = run(&MemNet::new(), n, build, count, elems(n));
                let what = format!("{name}, {n} ranks, {count} elements");
                let fits = |r| {
                    let steps = build(n, r, count).steps;
                    steps.len() <= EAGER_MAX_STEPS && steps.iter().all(|s| s.count() * 4 <= 48)
                };
                let want: Vec<bool> = (0..n).map(fits).collect();
                assert_eq!(e_on, want, "{what}: eager");
                assert!(count > 3 || want.iter().all(|&e| e), "{what}: a tiny call");
                assert!(
                    count < 13 || name != "all-reduce direct" || !want[0],
                    "{what}"
                );
                assert!(
                    e_off.iter().all(|&e| !e),
                    "{what}: no eager path, yet {e_off:?}"
                );
                assert_eq!(out_on, out_off, "{what}: the two paths differ");
                if name.starts_with("all-reduce") || name.starts_with("tree") {
                    let want: Vec<i32> = (0..count)
                        .map(|k| (0..n).map(|r| (r * 1000 + k) as i32).sum())
                        .collect();
                    for out in &out_on {
                        assert_eq!(out[..], *bytemuck::cast_slice::<i32, u8>(&want), "{what}");
                    }
                }
            }
        }
    }
}
