//! The low-latency path for tiny messages: every rank sends its whole input
//! to every other rank, then reduces all contributions locally in rank order.
//! One message latency instead of the ring's `2(n-1)`, at `n-1` times the
//! bytes — the right trade below a few KiB. Every rank reduces in the same
//! order, so every rank gets the same bits.

use super::{Loc, Schedule, Step};

/// All-reduce by exchange: contributions land in scratch slot `p`, then
/// `Out = Scratch(0) ⊕ … ⊕ Scratch(n-1)`.
pub fn all_reduce_direct(n: usize, r: usize, count: usize) -> Schedule {
    if count == 0 {
        return Schedule::default();
    }
    let mut steps = vec![Step::Copy {
        src: Loc::In(0),
        dst: scratch(r, count),
        count,
    }];
    // Send from the scratch copy, not from `In`: in place, `In` is `Out`,
    // which the local reduction below overwrites while sends may still be
    // reading.
    for s in 1..n {
        steps.push(Step::Send {
            to: (r + s) % n,
            src: scratch(r, count),
            count,
        });
    }
    gather_and_reduce(&mut steps, n, r, count)
}

/// Reduce-scatter by exchange: every rank sends block `q` of its input to
/// rank `q`, and reduces the `n` contributions to its own block in rank
/// order (`Out = Scratch(0) ⊕ … ⊕ Scratch(n-1)`). Its own block goes to
/// scratch first: in place, `Out` is that block of `In`.
pub fn reduce_scatter_direct(n: usize, r: usize, recv_count: usize) -> Schedule {
    let count = recv_count;
    if count == 0 {
        return Schedule::default();
    }
    let mut steps = Vec::with_capacity(2 * n + 1);
    for s in 1..n {
        let to = (r + s) % n;
        steps.push(Step::Send {
            to,
            src: Loc::In(to * count),
            count,
        });
    }
    steps.push(Step::Copy {
        src: Loc::In(r * count),
        dst: scratch(r, count),
        count,
    });
    gather_and_reduce(&mut steps, n, r, count)
}

/// Scratch slot `p` (rank `p`'s contribution) of `count` elements.
fn scratch(p: usize, count: usize) -> Loc {
    Loc::Scratch(p * count)
}

/// Appends the receives of every peer's contribution into its scratch slot
/// and the reduction of all `n` slots, in rank order, into `Out`.
fn gather_and_reduce(steps: &mut Vec<Step>, n: usize, r: usize, count: usize) -> Schedule {
    for s in 1..n {
        let from = (r + n - s) % n;
        steps.push(Step::Recv {
            from,
            dst: scratch(from, count),
            count,
        });
    }
    steps.push(Step::Copy {
        src: scratch(0, count),
        dst: Loc::Out(0),
        count,
    });
    for p in 1..n {
        steps.push(Step::Reduce {
            src: scratch(p, count),
            dst: Loc::Out(0),
            count,
            finalize: p == n - 1,
        });
    }
    Schedule {
        steps: std::mem::take(steps),
        scratch: n * count,
    }
}
