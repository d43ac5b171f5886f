//! Pipelined ring schedules.
//!
//! The ring is `0 → 1 → … → n-1 → 0`, or any other order of the ranks
//! ([`RingOrder`]; the `_on` forms): segment and block indices stay rank
//! ids, only the neighbours change. Reduction collectives split the buffer
//! into `n` segments (one per rank, nearly equal, see
//! [`part_start`](super::part_start)); each segment is cut into slices of at
//! most `chunk` elements, and slice `k` of every segment forms round `k`.
//!
//! Step `j` of round `k` gets the sort key `(k + j, k)`: the steps of
//! consecutive rounds interleave as a wavefront, so while a rank reduces
//! slice `k` the next slice is already on the wire. Sender and receiver use
//! the same key for a message (the receiver's step is `j + 1` for the
//! sender's step `j`), so the per-link order is the same on both sides.
//!
//! All-reduce, rank `r` (NCCL's `runRing` in `all_reduce.h`):
//! ```text
//! j = 0            Send               segment r
//! j = 1 ..= n-2    RecvReduceCopySend segment r-j      (partial sum in Out)
//! j = n-1          RecvReduceCopySend segment r+1      (final, forwarded)
//! j = n ..= 2n-3   RecvCopySend       segment r+1-(j-n+1)
//! j = 2n-2         Recv               segment r+2
//! ```

use super::{part_len, part_start, Loc, Schedule, Step};

/// The order the ranks sit in around the ring: `order[i]` is the rank at
/// position `i`, and each rank sends to the one after it. Every rank of a
/// communicator must use the same order (the planner derives it from facts
/// all ranks share); the identity is the rank-order ring.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RingOrder {
    order: Vec<usize>,
    pos: Vec<usize>,
}

impl RingOrder {
    /// The ring `0 → 1 → … → n-1 → 0`.
    pub fn identity(n: usize) -> RingOrder {
        RingOrder {
            order: (0..n).collect(),
            pos: (0..n).collect(),
        }
    }

    /// The ring through `order`; `None` unless it is a permutation of
    /// `0..order.len()`.
    pub fn new(order: Vec<usize>) -> Option<RingOrder> {
        let n = order.len();
        let mut pos = vec![usize::MAX; n];
        for (i, &r) in order.iter().enumerate() {
            if r >= n || pos[r] != usize::MAX {
                return None;
            }
            pos[r] = i;
        }
        Some(RingOrder { order, pos })
    }

    /// The ranks in ring order.
    pub fn ranks(&self) -> &[usize] {
        &self.order
    }

    /// Ranks on the ring.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether the ring is empty.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Whether this is the rank-order ring.
    pub fn is_identity(&self) -> bool {
        self.order.iter().enumerate().all(|(i, &r)| i == r)
    }

    /// Position of rank `r`.
    pub fn position(&self, r: usize) -> usize {
        self.pos[r]
    }

    /// The rank `j` places after `r` (any `j`; wraps around).
    pub fn ahead(&self, r: usize, j: usize) -> usize {
        let n = self.order.len();
        self.order[(self.pos[r] + j % n) % n]
    }

    /// The rank `j` places before `r` (any `j`; wraps around).
    pub fn back(&self, r: usize, j: usize) -> usize {
        let n = self.order.len();
        self.order[(self.pos[r] + n - j % n) % n]
    }

    fn next(&self, r: usize) -> usize {
        self.ahead(r, 1)
    }

    fn prev(&self, r: usize) -> usize {
        self.back(r, 1)
    }

    /// Places from `from` forward to `to`.
    fn distance(&self, from: usize, to: usize) -> usize {
        let n = self.order.len();
        (self.pos[to] + n - self.pos[from]) % n
    }
}

fn rounds(len: usize, chunk: usize) -> usize {
    len.div_ceil(chunk.max(1))
}

/// Slice `k` of a part `[start, start+len)`: `(offset, len)`, len may be 0.
fn slice(start: usize, len: usize, k: usize, chunk: usize) -> (usize, usize) {
    let o = k * chunk;
    (start + o, len.saturating_sub(o).min(chunk))
}

/// Collects keyed steps and sorts them into the wavefront order.
#[derive(Default)]
struct Wave(Vec<((usize, usize), Step)>);

impl Wave {
    fn push(&mut self, k: usize, j: usize, step: Step) {
        if step.count() > 0 {
            self.0.push(((k + j, k), step));
        }
    }

    fn finish(mut self, scratch: usize) -> Schedule {
        self.0.sort_by_key(|(key, _)| *key);
        Schedule {
            steps: self.0.into_iter().map(|(_, s)| s).collect(),
            scratch,
        }
    }
}

fn single(count: usize) -> Schedule {
    let mut w = Wave::default();
    w.push(
        0,
        0,
        Step::Copy {
            src: Loc::In(0),
            dst: Loc::Out(0),
            count,
        },
    );
    w.finish(0)
}

/// Ring all-reduce of `count` elements.
pub fn all_reduce(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    all_reduce_on(&RingOrder::identity(n), r, count, chunk)
}

/// Ring all-reduce of `count` elements around `ring`.
pub fn all_reduce_on(ring: &RingOrder, r: usize, count: usize, chunk: usize) -> Schedule {
    let n = ring.len();
    if n == 1 {
        return single(count);
    }
    let (nx, pv) = (ring.next(r), ring.prev(r));
    let seg = |s: usize, k: usize| slice(part_start(count, n, s), part_len(count, n, s), k, chunk);
    let mut w = Wave::default();
    for k in 0..rounds(part_len(count, n, 0), chunk) {
        let (o, c) = seg(r, k);
        w.push(
            k,
            0,
            Step::Send {
                to: nx,
                src: Loc::In(o),
                count: c,
            },
        );
        for j in 1..n {
            let (o, c) = seg(ring.back(r, j), k);
            let step = Step::RecvReduceCopySend {
                from: pv,
                to: Some(nx),
                src: Loc::In(o),
                dst: Loc::Out(o),
                count: c,
                finalize: j == n - 1,
            };
            w.push(k, j, step);
        }
        for i in 1..n {
            let (o, c) = seg(ring.back(r, i - 1), k);
            let step = if i < n - 1 {
                Step::RecvCopySend {
                    from: pv,
                    to: nx,
                    dst: Loc::Out(o),
                    count: c,
                }
            } else {
                Step::Recv {
                    from: pv,
                    dst: Loc::Out(o),
                    count: c,
                }
            };
            w.push(k, n - 1 + i, step);
        }
    }
    w.finish(0)
}

/// Ring reduce-scatter: `recv_count` elements per rank; the input holds
/// `n * recv_count`, rank `r`'s result is input segment `r` reduced.
pub fn reduce_scatter(n: usize, r: usize, recv_count: usize, chunk: usize) -> Schedule {
    reduce_scatter_on(&RingOrder::identity(n), r, recv_count, chunk)
}

/// Ring reduce-scatter around `ring`.
pub fn reduce_scatter_on(ring: &RingOrder, r: usize, recv_count: usize, chunk: usize) -> Schedule {
    let n = ring.len();
    if n == 1 {
        return single(recv_count);
    }
    let (nx, pv) = (ring.next(r), ring.prev(r));
    let mut w = Wave::default();
    for k in 0..rounds(recv_count, chunk) {
        let (o, c) = slice(0, recv_count, k, chunk);
        let at = |s: usize| s * recv_count + o;
        w.push(
            k,
            0,
            Step::Send {
                to: nx,
                src: Loc::In(at(ring.back(r, 1))),
                count: c,
            },
        );
        for j in 1..n {
            let s = ring.back(r, j + 1);
            let last = j == n - 1;
            let step = Step::RecvReduceCopySend {
                from: pv,
                to: (!last).then_some(nx),
                src: Loc::In(at(s)),
                dst: if last {
                    Loc::Out(o)
                } else {
                    Loc::Scratch(at(s))
                },
                count: c,
                finalize: last,
            };
            w.push(k, j, step);
        }
    }
    w.finish(n * recv_count)
}

/// Ring all-gather: `send_count` elements per rank into `n * send_count`.
pub fn all_gather(n: usize, r: usize, send_count: usize, chunk: usize) -> Schedule {
    all_gather_on(&RingOrder::identity(n), r, send_count, chunk)
}

/// Ring all-gather around `ring`.
pub fn all_gather_on(ring: &RingOrder, r: usize, send_count: usize, chunk: usize) -> Schedule {
    let n = ring.len();
    let (nx, pv) = (ring.next(r), ring.prev(r));
    let mut w = Wave::default();
    for k in 0..rounds(send_count, chunk) {
        let (o, c) = slice(0, send_count, k, chunk);
        // The send first, then the local copy while it travels.
        if n > 1 {
            w.push(
                k,
                0,
                Step::Send {
                    to: nx,
                    src: Loc::In(o),
                    count: c,
                },
            );
        }
        w.push(
            k,
            0,
            Step::Copy {
                src: Loc::In(o),
                dst: Loc::Out(r * send_count + o),
                count: c,
            },
        );
        if n == 1 {
            continue;
        }
        for j in 1..n {
            let dst = Loc::Out(ring.back(r, j) * send_count + o);
            let step = if j < n - 1 {
                Step::RecvCopySend {
                    from: pv,
                    to: nx,
                    dst,
                    count: c,
                }
            } else {
                Step::Recv {
                    from: pv,
                    dst,
                    count: c,
                }
            };
            w.push(k, j, step);
        }
    }
    w.finish(0)
}

/// Pipelined chain broadcast from `root` along the ring.
pub fn broadcast(n: usize, r: usize, root: usize, count: usize, chunk: usize) -> Schedule {
    broadcast_on(&RingOrder::identity(n), r, root, count, chunk)
}

/// Pipelined chain broadcast from `root` around `ring`.
pub fn broadcast_on(
    ring: &RingOrder,
    r: usize,
    root: usize,
    count: usize,
    chunk: usize,
) -> Schedule {
    let n = ring.len();
    let (nx, pv) = (ring.next(r), ring.prev(r));
    let pos = ring.distance(root, r);
    let mut w = Wave::default();
    for k in 0..rounds(count, chunk) {
        let (o, c) = slice(0, count, k, chunk);
        if pos == 0 {
            // The send first, then the local copy while it travels.
            if n > 1 {
                w.push(
                    k,
                    0,
                    Step::Send {
                        to: nx,
                        src: Loc::In(o),
                        count: c,
                    },
                );
            }
            w.push(
                k,
                0,
                Step::Copy {
                    src: Loc::In(o),
                    dst: Loc::Out(o),
                    count: c,
                },
            );
        } else if pos < n - 1 {
            w.push(
                k,
                0,
                Step::RecvCopySend {
                    from: pv,
                    to: nx,
                    dst: Loc::Out(o),
                    count: c,
                },
            );
        } else {
            w.push(
                k,
                0,
                Step::Recv {
                    from: pv,
                    dst: Loc::Out(o),
                    count: c,
                },
            );
        }
    }
    w.finish(0)
}

/// Pipelined chain reduce to `root` along the ring; the chain starts at
/// `root + 1` and ends at `root`.
pub fn reduce(n: usize, r: usize, root: usize, count: usize, chunk: usize) -> Schedule {
    reduce_on(&RingOrder::identity(n), r, root, count, chunk)
}

/// Pipelined chain reduce to `root` around `ring`; the chain starts at the
/// rank after `root` and ends at `root`.
pub fn reduce_on(ring: &RingOrder, r: usize, root: usize, count: usize, chunk: usize) -> Schedule {
    let n = ring.len();
    if n == 1 {
        return single(count);
    }
    let (nx, pv) = (ring.next(r), ring.prev(r));
    let pos = (ring.distance(root, r) + n - 1) % n;
    let mut w = Wave::default();
    for k in 0..rounds(count, chunk) {
        let (o, c) = slice(0, count, k, chunk);
        let step = if pos == 0 {
            Step::Send {
                to: nx,
                src: Loc::In(o),
                count: c,
            }
        } else {
            let last = pos == n - 1;
            Step::RecvReduceCopySend {
                from: pv,
                to: (!last).then_some(nx),
                src: Loc::In(o),
                dst: if last { Loc::Out(o) } else { Loc::Scratch(o) },
                count: c,
                finalize: last,
            }
        };
        w.push(k, 0, step);
    }
    w.finish(if pos == 0 || pos == n - 1 { 0 } else { count })
}
