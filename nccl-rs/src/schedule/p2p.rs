//! Point-to-point schedules: all-to-all, gather, scatter and grouped
//! send/recv. Every rank posts all its sends before its receives, so with
//! non-blocking sends no cyclic wait can form.

use super::{Loc, Schedule, Step};

/// Pairwise-exchange all-to-all: `count` elements to and from every rank.
pub fn all_to_all(n: usize, r: usize, count: usize) -> Schedule {
    let mut steps = vec![Step::Copy { src: Loc::In(r * count), dst: Loc::Out(r * count), count }];
    for s in 1..n {
        let to = (r + s) % n;
        steps.push(Step::Send { to, src: Loc::In(to * count), count });
    }
    for s in 1..n {
        let from = (r + n - s) % n;
        steps.push(Step::Recv { from, dst: Loc::Out(from * count), count });
    }
    finish(steps)
}

/// Gather `count` elements from every rank into `root`'s output.
pub fn gather(n: usize, r: usize, root: usize, count: usize) -> Schedule {
    let steps = if r == root {
        (0..n)
            .map(|p| match p == root {
                true => Step::Copy { src: Loc::In(0), dst: Loc::Out(p * count), count },
                false => Step::Recv { from: p, dst: Loc::Out(p * count), count },
            })
            .collect()
    } else {
        vec![Step::Send { to: root, src: Loc::In(0), count }]
    };
    finish(steps)
}

/// Scatter `count` elements from `root`'s input to every rank.
pub fn scatter(n: usize, r: usize, root: usize, count: usize) -> Schedule {
    let steps = if r == root {
        (0..n)
            .map(|p| match p == root {
                true => Step::Copy { src: Loc::In(p * count), dst: Loc::Out(0), count },
                false => Step::Send { to: p, src: Loc::In(p * count), count },
            })
            .collect()
    } else {
        vec![Step::Recv { from: root, dst: Loc::Out(0), count }]
    };
    finish(steps)
}

/// One operation of a send/recv group. `buf` indexes the group's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum P2pOp {
    /// Send `count` elements of buffer `buf` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// Index of the group buffer.
        buf: usize,
        /// Elements.
        count: usize,
    },
    /// Receive `count` elements from `peer` into buffer `buf`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Index of the group buffer.
        buf: usize,
        /// Elements.
        count: usize,
    },
}

/// A group of sends and receives: all sends first, then all receives, each
/// in the caller's order (so per-peer order is kept, as NCCL matches it).
pub fn p2p_group(ops: &[P2pOp]) -> Schedule {
    let mut steps = Vec::with_capacity(ops.len());
    for op in ops {
        if let P2pOp::Send { peer, buf, count } = *op {
            steps.push(Step::Send { to: peer, src: Loc::Group(buf, 0), count });
        }
    }
    for op in ops {
        if let P2pOp::Recv { peer, buf, count } = *op {
            steps.push(Step::Recv { from: peer, dst: Loc::Group(buf, 0), count });
        }
    }
    finish(steps)
}

fn finish(mut steps: Vec<Step>) -> Schedule {
    steps.retain(|s| s.count() > 0);
    Schedule { steps, scratch: 0 }
}
