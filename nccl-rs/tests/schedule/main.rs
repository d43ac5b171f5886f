//! Symbolic runs of every schedule at many world sizes, counts and chunk
//! sizes (no sockets, no engine), through `nccl_rs::schedule` and its
//! `check` module.
// Loops over ranks read as the math does (`for r in 0..n`, `b[r]`).
#![allow(clippy::needless_range_loop)]

use nccl_rs::schedule::check::{self, simulate, SymBufs, Val};
use nccl_rs::schedule::*;

mod halving_doubling;
mod p2p;
mod ring_order;

const SIZES: &[usize] = &[1, 2, 3, 4, 5, 7, 8, 13, 16, 64];
const COUNTS: &[usize] = &[0, 1, 7, 64, 1023];
const CHUNKS: &[usize] = &[1, 3, 64, 1 << 20];

fn all(n: usize) -> u128 {
    if n == 128 {
        u128::MAX
    } else {
        (1u128 << n) - 1
    }
}

fn v(rank: usize, index: usize) -> Option<Val> {
    Some(Val {
        ranks: 1 << rank,
        index: index as u64,
    })
}

fn run(
    n: usize,
    sched: impl Fn(usize) -> Schedule,
    input: impl Fn(usize) -> Vec<Option<Val>>,
    out_len: usize,
) -> Vec<SymBufs> {
    let scheds: Vec<_> = (0..n).map(&sched).collect();
    check::check_matching(&scheds).unwrap();
    let mut bufs: Vec<_> = (0..n)
        .map(|r| SymBufs {
            input: input(r),
            output: vec![None; out_len],
            scratch: vec![],
        })
        .collect();
    simulate(&scheds, &mut bufs).unwrap_or_else(|e| panic!("n={n}: {e}"));
    bufs
}

fn expect(out: &[Option<Val>], want: impl Fn(usize) -> Val, what: &str) {
    for (i, x) in out.iter().enumerate() {
        assert_eq!(*x, Some(want(i)), "{what}: element {i}");
    }
}

/// Rank `r`'s input of `c` elements: its own values `v(r, i)`.
fn own(c: usize) -> impl Fn(usize) -> Vec<Option<Val>> {
    move |r| (0..c).map(|i| v(r, i)).collect()
}

/// Element `i` reduced over all `n` ranks.
fn reduced(n: usize) -> impl Fn(usize) -> Val {
    move |i| Val {
        ranks: all(n),
        index: i as u64,
    }
}

/// Checks that `sched` leaves every rank of `n` with the sum of all inputs
/// (`c` elements each); `what` names the schedule.
fn check_all_reduce(n: usize, c: usize, what: &str, sched: impl Fn(usize) -> Schedule) {
    let b = run(n, sched, own(c), c);
    for r in 0..n {
        expect(
            &b[r].output,
            reduced(n),
            &format!("{what} n={n} c={c} rank {r}"),
        );
    }
}

#[test]
fn ring_all_reduce_every_element_reduced_once() {
    for &n in SIZES {
        for &c in COUNTS {
            for &ch in CHUNKS {
                let what = format!("all_reduce chunk={ch}");
                check_all_reduce(n, c, &what, |r| all_reduce(n, r, c, ch));
            }
        }
    }
}

/// Checks that `sched` leaves every rank `r` of `n` with block `r` of the
/// sum of all inputs (`c` elements).
fn check_reduce_scatter(n: usize, c: usize, what: &str, sched: impl Fn(usize) -> Schedule) {
    let b = run(n, sched, |r| (0..n * c).map(|i| v(r, i)).collect(), c);
    for r in 0..n {
        let want = |i: usize| Val {
            ranks: all(n),
            index: (r * c + i) as u64,
        };
        expect(&b[r].output, want, &format!("{what} n={n} c={c} rank {r}"));
    }
}

#[test]
fn ring_and_direct_reduce_scatter() {
    for &n in SIZES {
        for &c in COUNTS {
            for &ch in CHUNKS {
                let what = format!("reduce_scatter chunk={ch}");
                check_reduce_scatter(n, c, &what, |r| reduce_scatter(n, r, c, ch));
            }
            check_reduce_scatter(n, c, "reduce_scatter_direct", |r| {
                reduce_scatter_direct(n, r, c)
            });
        }
    }
}

#[test]
fn ring_all_gather() {
    for &n in SIZES {
        for &c in COUNTS {
            for &ch in CHUNKS {
                let b = run(
                    n,
                    |r| all_gather(n, r, c, ch),
                    |r| (0..c).map(|i| v(r, r * c + i)).collect(),
                    n * c,
                );
                for r in 0..n {
                    let what = format!("all_gather n={n} c={c} chunk={ch} rank {r}");
                    expect(
                        &b[r].output,
                        |i| Val {
                            ranks: 1 << (i / c),
                            index: i as u64,
                        },
                        &what,
                    );
                }
            }
        }
    }
}

#[test]
fn chain_broadcast_and_reduce_every_root() {
    for &n in SIZES {
        for &c in COUNTS {
            for &ch in CHUNKS {
                for root in [0, n / 2, n - 1] {
                    let b = run(n, |r| broadcast(n, r, root, c, ch), own(c), c);
                    for r in 0..n {
                        let what = format!("broadcast n={n} c={c} root={root} rank {r}");
                        expect(
                            &b[r].output,
                            |i| Val {
                                ranks: 1 << root,
                                index: i as u64,
                            },
                            &what,
                        );
                    }
                    let b = run(n, |r| reduce(n, r, root, c, ch), own(c), c);
                    let what = format!("reduce n={n} c={c} root={root}");
                    expect(&b[root].output, reduced(n), &what);
                }
            }
        }
    }
}

#[test]
fn a_broken_schedule_is_caught() {
    // Drop one step of rank 1: the check must fail, proving it can.
    let n = 3;
    let mut scheds: Vec<_> = (0..n).map(|r| all_reduce(n, r, 9, 3)).collect();
    scheds[1].steps.remove(2);
    let mut bufs: Vec<_> = (0..n)
        .map(|r| SymBufs {
            input: (0..9).map(|i| v(r, i)).collect(),
            output: vec![None; 9],
            scratch: vec![],
        })
        .collect();
    assert!(simulate(&scheds, &mut bufs).is_err());
    assert!(check::check_matching(&scheds).is_err());
}

#[test]
fn parts_cover_exactly() {
    for count in [0, 1, 7, 10, 1000003] {
        for parts in 1..10 {
            let total: usize = (0..parts).map(|i| part_len(count, parts, i)).sum();
            assert_eq!(total, count);
            assert_eq!(part_start(count, parts, parts), count);
        }
    }
}

#[test]
fn p2p_group_sends_before_receives() {
    let s = p2p_group(
        0,
        &[
            P2pOp::Recv {
                peer: 1,
                buf: 0,
                count: 4,
            },
            P2pOp::Send {
                peer: 1,
                buf: 1,
                count: 4,
            },
            P2pOp::Send {
                peer: 2,
                buf: 2,
                count: 0,
            },
        ],
    )
    .unwrap();
    assert_eq!(s.steps.len(), 2);
    assert!(matches!(s.steps[0], Step::Send { to: 1, .. }));
    assert!(matches!(s.steps[1], Step::Recv { from: 1, .. }));
}

#[test]
fn tree_and_direct_all_reduce_every_element_reduced_once() {
    for &n in SIZES {
        for &c in COUNTS {
            for &ch in CHUNKS {
                let what = format!("tree ch={ch}");
                check_all_reduce(n, c, &what, |r| all_reduce_tree(n, r, c, ch));
            }
            check_all_reduce(n, c, "direct", |r| all_reduce_direct(n, r, c));
        }
    }
}

#[test]
fn p2p_group_pairs_self_sends_with_self_receives() {
    let s = p2p_group(
        3,
        &[
            P2pOp::Send {
                peer: 3,
                buf: 0,
                count: 5,
            },
            P2pOp::Recv {
                peer: 3,
                buf: 1,
                count: 5,
            },
        ],
    )
    .unwrap();
    assert_eq!(
        s.steps,
        vec![Step::Copy {
            src: Loc::Group(0, 0),
            dst: Loc::Group(1, 0),
            count: 5
        }]
    );
    assert!(p2p_group(
        3,
        &[P2pOp::Send {
            peer: 3,
            buf: 0,
            count: 5
        }]
    )
    .is_err());
    assert!(p2p_group(
        3,
        &[
            P2pOp::Send {
                peer: 3,
                buf: 0,
                count: 5
            },
            P2pOp::Recv {
                peer: 3,
                buf: 1,
                count: 4
            }
        ]
    )
    .is_err());
}

/// The schedule with every read of the input redirected to the output, as
/// the engine runs an in-place call (`In` and `Out` are the same memory).
fn in_place(mut s: Schedule) -> Schedule {
    let fix = |l: &mut Loc| {
        if let Loc::In(o) = *l {
            *l = Loc::Out(o);
        }
    };
    for step in &mut s.steps {
        match step {
            Step::Send { src, .. } => fix(src),
            Step::RecvReduceCopySend { src, dst, .. }
            | Step::Reduce { src, dst, .. }
            | Step::Copy { src, dst, .. } => {
                fix(src);
                fix(dst);
            }
            Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => fix(dst),
        }
    }
    s
}

#[test]
fn all_reduce_schedules_work_in_place() {
    type Algo = fn(usize, usize, usize, usize) -> Schedule;
    let algos: [(&str, Algo); 3] = [
        ("ring", all_reduce),
        ("tree", all_reduce_tree),
        ("halving-doubling", all_reduce_halving_doubling),
    ];
    for (name, algo) in algos {
        for n in [1, 2, 3, 5, 6, 8, 12, 13] {
            for (c, ch) in [(0, 4), (1, 4), (37, 4), (1000, 64)] {
                let scheds: Vec<_> = (0..n).map(|r| in_place(algo(n, r, c, ch))).collect();
                let mut bufs: Vec<_> = (0..n)
                    .map(|r| SymBufs {
                        input: vec![],
                        output: (0..c).map(|i| v(r, i)).collect(),
                        scratch: vec![],
                    })
                    .collect();
                simulate(&scheds, &mut bufs).unwrap_or_else(|e| panic!("{name} n={n}: {e}"));
                for (r, b) in bufs.iter().enumerate() {
                    let what = format!("{name} in place n={n} c={c} rank {r}");
                    expect(&b.output, reduced(n), &what);
                }
            }
        }
    }
}
