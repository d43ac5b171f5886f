//! Symbolic runs of the point-to-point schedules: all-to-all (out of place
//! and in place, mixed), one-hop all-gather and broadcast, gather, scatter.
// Loops over ranks read as the math does (`for r in 0..n`, `b[r]`).
#![allow(clippy::needless_range_loop)]

use super::{expect, run, v, COUNTS, SIZES};
use nccl_rs::schedule::check::{self, simulate, SymBufs, Val};
use nccl_rs::schedule::*;

/// In place, a rank's own block starts in its output and its staged input
/// lacks that block: the schedule must not read it there, and ranks in
/// place and out of place (even and odd here) must exchange the same
/// messages.
#[test]
fn in_place_all_to_all_leaves_the_own_block_and_mixes_with_out_of_place() {
    for &n in SIZES {
        for &c in COUNTS {
            for chunk in [1, 3, c.max(1), usize::MAX] {
                let in_place = |r: usize| r % 2 == 0;
                let scheds: Vec<_> = (0..n)
                    .map(|r| match in_place(r) {
                        true => all_to_all_in_place(n, r, c, chunk),
                        false => all_to_all(n, r, c, chunk),
                    })
                    .collect();
                check::check_matching(&scheds).unwrap();
                let own = |r: usize, i: usize| i / c.max(1) == r;
                let mut bufs: Vec<_> = (0..n)
                    .map(|r| {
                        let input: Vec<_> = (0..n * c).map(|i| v(r, i)).collect();
                        match in_place(r) {
                            true => SymBufs {
                                input: (0..n * c)
                                    .map(|i| input[i].filter(|_| !own(r, i)))
                                    .collect(),
                                output: (0..n * c)
                                    .map(|i| input[i].filter(|_| own(r, i)))
                                    .collect(),
                                scratch: vec![],
                            },
                            false => SymBufs {
                                input,
                                output: vec![None; n * c],
                                scratch: vec![],
                            },
                        }
                    })
                    .collect();
                simulate(&scheds, &mut bufs).unwrap_or_else(|e| panic!("n={n} c={c}: {e}"));
                for (r, b) in bufs.iter().enumerate() {
                    let what = format!("in-place all_to_all n={n} c={c} chunk={chunk} rank {r}");
                    let want = |i: usize| Val {
                        ranks: 1 << (i / c),
                        index: (r * c + i % c) as u64,
                    };
                    expect(&b.output, want, &what);
                }
            }
        }
    }
}

#[test]
fn pairwise_all_to_all_gather_scatter() {
    for &n in SIZES {
        for &c in COUNTS {
            // Whole blocks (usize::MAX) and rounds of 1, 3 and c elements.
            for chunk in [1, 3, c.max(1), usize::MAX] {
                let b = run(
                    n,
                    |r| all_to_all(n, r, c, chunk),
                    |r| (0..n * c).map(|i| v(r, i)).collect(),
                    n * c,
                );
                for r in 0..n {
                    // Output block s of rank r is input block r of rank s.
                    expect(
                        &b[r].output,
                        |i| Val {
                            ranks: 1 << (i / c),
                            index: (r * c + i % c) as u64,
                        },
                        "all_to_all",
                    );
                }
            }
            let b = run(
                n,
                |r| all_gather_direct(n, r, c),
                |r| (0..c).map(|i| v(r, r * c + i)).collect(),
                n * c,
            );
            for r in 0..n {
                expect(
                    &b[r].output,
                    |i| Val {
                        ranks: 1 << (i / c),
                        index: i as u64,
                    },
                    "all_gather_direct",
                );
            }
            for root in [0, n - 1] {
                let b = run(
                    n,
                    |r| broadcast_direct(n, r, root, c),
                    |r| (0..c).map(|i| v(r, i)).collect(),
                    c,
                );
                for (r, out) in b.iter().enumerate() {
                    let what = format!("broadcast_direct n={n} c={c} root={root} rank {r}");
                    expect(&out.output, |i| v(root, i).unwrap(), &what);
                }
                let b = run(
                    n,
                    |r| gather(n, r, root, c),
                    |r| (0..c).map(|i| v(r, r * c + i)).collect(),
                    n * c,
                );
                expect(
                    &b[root].output,
                    |i| Val {
                        ranks: 1 << (i / c),
                        index: i as u64,
                    },
                    "gather",
                );
                let b = run(
                    n,
                    |r| scatter(n, r, root, c),
                    |r| (0..n * c).map(|i| v(r, i)).collect(),
                    c,
                );
                for r in 0..n {
                    expect(
                        &b[r].output,
                        |i| Val {
                            ranks: 1 << root,
                            index: (r * c + i) as u64,
                        },
                        "scatter",
                    );
                }
            }
        }
    }
}

/// The two ranks' inputs trade places, whichever rank leads, and nothing
/// else moves.
#[test]
fn round_trip_swaps_the_inputs() {
    for &c in COUNTS {
        for leader in 0..2 {
            let b = run(
                2,
                |r| round_trip(1 - r, c, r == leader),
                |r| (0..c).map(|i| v(r, i)).collect(),
                c,
            );
            for r in 0..2 {
                expect(
                    &b[r].output,
                    |i| Val {
                        ranks: 1 << (1 - r),
                        index: i as u64,
                    },
                    "round trip",
                );
            }
        }
    }
}

/// Runs an all-to-all schedule symbolically: block q of rank r's output is
/// block r of rank q's input.
fn moves_every_block(n: usize, c: usize, ch: usize, sched: impl Fn(usize) -> Schedule) {
    let b = super::run(
        n,
        sched,
        |r| (0..n * c).map(|i| super::v(r, i)).collect(),
        n * c,
    );
    for r in 0..n {
        let want = |i: usize| Val {
            ranks: 1 << (i / c.max(1)),
            index: (r * c + i % c.max(1)) as u64,
        };
        super::expect(&b[r].output, want, &format!("n={n} c={c} ch={ch} rank {r}"));
    }
}

#[test]
fn paced_all_to_all_moves_the_same_blocks_one_peer_at_a_time() {
    for &n in &[2usize, 3, 4, 8] {
        for &c in &[0usize, 1, 7, 64] {
            for &ch in &[1usize, 3, 1 << 20] {
                moves_every_block(n, c, ch, |r| all_to_all_paced(n, r, c, ch));
                // Every receive directly follows its send.
                for r in 0..n {
                    let s = all_to_all_paced(n, r, c, ch);
                    for w in s.steps.windows(2) {
                        if let Step::Send { to, .. } = w[0] {
                            let from = (2 * r + n - to) % n;
                            assert_eq!(w[1].recv_peer(), Some(from), "n={n} rank {r}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn acked_all_to_all_waits_for_each_peer_to_take_its_message() {
    for &n in &[2usize, 3, 4, 8] {
        for &c in &[0usize, 1, 7, 64] {
            for &ch in &[1usize, 3, 1 << 20] {
                moves_every_block(n, c, ch, |r| all_to_all_acked(n, r, c, ch));
                // Send to r + s, receive from r - s, acknowledge to r - s,
                // then wait for r + s's acknowledgement before sending on.
                for r in 0..n {
                    let s = all_to_all_acked(n, r, c, ch);
                    assert_eq!(s.scratch, usize::from(c > 0));
                    let peers: Vec<_> = s
                        .steps
                        .iter()
                        .filter_map(|st| match *st {
                            Step::Send { to, count, .. } => Some((true, to, count)),
                            Step::Recv { from, count, .. } => Some((false, from, count)),
                            _ => None,
                        })
                        .collect();
                    assert_eq!(
                        peers.len(),
                        4 * (n - 1) * c.div_ceil(ch),
                        "n={n} c={c} ch={ch}"
                    );
                    for (k, q) in peers.chunks(4).enumerate() {
                        let s = k % (n - 1) + 1;
                        let (to, from) = ((r + s) % n, (r + n - s) % n);
                        let data = c.min(ch).min(c - (k / (n - 1)) * ch);
                        assert_eq!(
                            q,
                            [
                                (true, to, data),
                                (false, from, data),
                                (true, from, 1),
                                (false, to, 1)
                            ]
                        );
                    }
                }
            }
        }
    }
}
