//! Zero-copy plans: collectives over buffers every rank can map (shared
//! host memory on one host). A rank reads its peers' inputs and writes
//! their outputs directly; nothing goes through a transport. The plans are
//! as pure as the other schedules: which ranges of which rank's buffers
//! each rank reads and writes.
//!
//! # Exclusive ownership
//! Between the entry and exit barriers of the call (the caller's business),
//! every output element of every rank is written by exactly one rank,
//! once, and an element that is read as input by one rank is written (in
//! place) only by that same rank, after it read it. So no two ranks race
//! on any element, in place or not. [`check_zero_copy`] verifies the first
//! half for every collective at many sizes. In-place all-to-all, where a
//! rank's output is input another rank reads, is a set of swaps instead:
//! each pair of blocks that trade places is swapped by one rank, half of it
//! by each rank of the pair ([`ZcStep::Swap`]), so again nobody else
//! touches those elements.

use super::{part_len, part_start};

/// A buffer of some rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZcBuf {
    /// Rank `.0`'s input.
    In(usize),
    /// Rank `.0`'s output.
    Out(usize),
}

/// A position in a rank's buffer, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZcAt {
    /// Which buffer.
    pub buf: ZcBuf,
    /// Element offset.
    pub off: usize,
}

fn at(buf: ZcBuf, off: usize) -> ZcAt {
    ZcAt { buf, off }
}

/// One step of a zero-copy plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ZcStep {
    /// `srcs[0] ⊕ srcs[1] ⊕ …` (in that order), then the average's division,
    /// written to every one of `dsts`.
    Reduce {
        /// Operands, in reduction order.
        srcs: Vec<ZcAt>,
        /// Where the result goes.
        dsts: Vec<ZcAt>,
        /// Elements.
        count: usize,
    },
    /// Exchange `count` elements between two outputs (in place, each
    /// holds the input the other needs).
    Swap {
        /// One side.
        a: ZcAt,
        /// The other side.
        b: ZcAt,
        /// Elements.
        count: usize,
    },
    /// Copy `count` elements.
    Copy {
        /// Source.
        src: ZcAt,
        /// Destination.
        dst: ZcAt,
        /// Elements.
        count: usize,
    },
}

/// The collectives with zero-copy plans, with their per-rank counts as in
/// the ring schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZcColl {
    /// `count` elements everywhere.
    AllReduce {
        /// Elements.
        count: usize,
    },
    /// `recv_count` elements out per rank.
    ReduceScatter {
        /// Elements per rank.
        recv_count: usize,
    },
    /// `send_count` elements in per rank.
    AllGather {
        /// Elements per rank.
        send_count: usize,
    },
    /// `count` elements from `root`.
    Broadcast {
        /// Elements.
        count: usize,
        /// Source rank.
        root: usize,
        /// Every rank, the root too, copies a share of every other rank's
        /// output (the root has no copy of its own to make: its call is in
        /// place); otherwise each rank copies into its own output.
        root_shares: bool,
    },
    /// `count` elements to `root`, reduced.
    Reduce {
        /// Elements.
        count: usize,
        /// Destination rank.
        root: usize,
    },
    /// `count` elements between every pair.
    AllToAll {
        /// Elements per pair.
        count: usize,
    },
    /// [`ZcColl::AllToAll`] with every rank in place.
    AllToAllInPlace {
        /// Elements per pair.
        count: usize,
    },
    /// `count` elements from every rank into `root`'s output.
    Gather {
        /// Elements per rank.
        count: usize,
        /// Destination rank.
        root: usize,
    },
    /// Part `r` (`count` elements) of `root`'s input to every rank `r`.
    Scatter {
        /// Elements per rank.
        count: usize,
        /// Source rank.
        root: usize,
    },
}

/// The steps of rank `r` of `n` for `coll`.
pub fn zero_copy(coll: ZcColl, n: usize, r: usize) -> Vec<ZcStep> {
    let all = |f: fn(usize) -> ZcBuf, off: usize| (0..n).map(|q| at(f(q), off)).collect::<Vec<_>>();
    let mut steps = Vec::new();
    match coll {
        ZcColl::AllReduce { count } => {
            let (o, c) = (part_start(count, n, r), part_len(count, n, r));
            steps.push(ZcStep::Reduce {
                srcs: all(ZcBuf::In, o),
                dsts: all(ZcBuf::Out, o),
                count: c,
            });
        }
        ZcColl::Reduce { count, root } => {
            let (o, c) = (part_start(count, n, r), part_len(count, n, r));
            steps.push(ZcStep::Reduce {
                srcs: all(ZcBuf::In, o),
                dsts: vec![at(ZcBuf::Out(root), o)],
                count: c,
            });
        }
        ZcColl::ReduceScatter { recv_count } => {
            steps.push(ZcStep::Reduce {
                srcs: all(ZcBuf::In, r * recv_count),
                dsts: vec![at(ZcBuf::Out(r), 0)],
                count: recv_count,
            });
        }
        ZcColl::AllGather { send_count } => {
            // In rank order, the same on every rank: all ranks copy the
            // same input at a time (its owner into its own output), so each
            // input is read from memory once and shared in the caches. That
            // beat each rank starting with the next rank's part (every rank
            // reading a different input at a time) by 10-20% out of place
            // at 1-64 MiB.
            for q in 0..n {
                steps.push(ZcStep::Copy {
                    src: at(ZcBuf::In(q), 0),
                    dst: at(ZcBuf::Out(r), q * send_count),
                    count: send_count,
                });
            }
        }
        ZcColl::Broadcast {
            count,
            root,
            root_shares,
        } => {
            // The root writes its own output (a no-op in place; no other
            // rank writes the buffer the others read). Out of place, every
            // other rank copies the message into its own output; in place,
            // where the root has no copy of its own to make, every output
            // but the root's is cut in `n` parts and each rank copies its
            // part into all of them. (Sharing out of place, among the other
            // ranks, measured slower.)
            if r == root {
                steps.push(ZcStep::Copy {
                    src: at(ZcBuf::In(root), 0),
                    dst: at(ZcBuf::Out(root), 0),
                    count,
                });
            }
            if !root_shares {
                if r != root {
                    steps.push(ZcStep::Copy {
                        src: at(ZcBuf::In(root), 0),
                        dst: at(ZcBuf::Out(r), 0),
                        count,
                    });
                }
            } else {
                let pos = (r + n - root) % n;
                let (o, c) = (part_start(count, n, pos), part_len(count, n, pos));
                for k in 0..n {
                    // Our own output first, then the next ranks': ranks
                    // write different outputs at a time.
                    let q = (r + k) % n;
                    if q != root {
                        steps.push(ZcStep::Copy {
                            src: at(ZcBuf::In(root), o),
                            dst: at(ZcBuf::Out(q), o),
                            count: c,
                        });
                    }
                }
            }
        }
        ZcColl::AllToAll { count } => {
            for k in 0..n {
                let q = (r + 1 + k) % n;
                steps.push(ZcStep::Copy {
                    src: at(ZcBuf::In(q), r * count),
                    dst: at(ZcBuf::Out(r), q * count),
                    count,
                });
            }
        }
        ZcColl::AllToAllInPlace { count } => {
            // Rank r's block q and rank q's block r trade places: the lower
            // rank of the pair swaps the first half, the higher the rest.
            // The own block is already in place (a copy onto itself).
            for k in 0..n {
                let q = (r + 1 + k) % n;
                if q == r {
                    steps.push(ZcStep::Copy {
                        src: at(ZcBuf::In(r), r * count),
                        dst: at(ZcBuf::Out(r), r * count),
                        count,
                    });
                    continue;
                }
                let half = count / 2;
                let (lo, hi) = if r < q { (0, half) } else { (half, count) };
                steps.push(ZcStep::Swap {
                    a: at(ZcBuf::Out(r), q * count + lo),
                    b: at(ZcBuf::Out(q), r * count + lo),
                    count: hi - lo,
                });
            }
        }
        ZcColl::Gather { count, root } => steps.push(ZcStep::Copy {
            src: at(ZcBuf::In(r), 0),
            dst: at(ZcBuf::Out(root), r * count),
            count,
        }),
        ZcColl::Scatter { count, root } => steps.push(ZcStep::Copy {
            src: at(ZcBuf::In(root), r * count),
            dst: at(ZcBuf::Out(r), 0),
            count,
        }),
    }
    steps.retain(|s| match s {
        ZcStep::Reduce { count, .. } | ZcStep::Copy { count, .. } | ZcStep::Swap { count, .. } => {
            *count > 0
        }
    });
    steps
}

/// Checks that the plans of all `n` ranks write every element of every
/// output that `coll` defines exactly once, with the right sources, and
/// nothing else.
pub fn check_zero_copy(coll: ZcColl, n: usize) -> Result<(), String> {
    check_plans(coll, n, |r| zero_copy(coll, n, r))
}

/// [`check_zero_copy`] of the plans `plan(rank)`.
fn check_plans(coll: ZcColl, n: usize, plan: impl Fn(usize) -> Vec<ZcStep>) -> Result<(), String> {
    use std::collections::HashMap;
    // For every written output element: the sources that produced it.
    let mut written: HashMap<(usize, usize), Vec<(ZcBuf, usize)>> = HashMap::new();
    for r in 0..n {
        for step in plan(r) {
            // In place, an output's old content is its rank's input: a swap
            // writes each side from the other side's input.
            let input_of = |z: ZcAt| match z.buf {
                ZcBuf::Out(q) | ZcBuf::In(q) => at(ZcBuf::In(q), z.off),
            };
            let moves = match step {
                ZcStep::Reduce { srcs, dsts, count } => vec![(srcs, dsts, count)],
                ZcStep::Copy { src, dst, count } => vec![(vec![src], vec![dst], count)],
                ZcStep::Swap { a, b, count } => vec![
                    (vec![input_of(b)], vec![a], count),
                    (vec![input_of(a)], vec![b], count),
                ],
            };
            for (srcs, dsts, count) in moves {
                for d in dsts {
                    let ZcBuf::Out(q) = d.buf else {
                        return Err(format!("rank {r} writes an input: {d:?}"));
                    };
                    for i in 0..count {
                        let from = srcs.iter().map(|s| (s.buf, s.off + i)).collect();
                        if written.insert((q, d.off + i), from).is_some() {
                            return Err(format!("rank {q}'s output {} written twice", d.off + i));
                        }
                    }
                }
            }
        }
    }
    let all_in = |off: usize| (0..n).map(|q| (ZcBuf::In(q), off)).collect::<Vec<_>>();
    let mut expect: HashMap<(usize, usize), Vec<(ZcBuf, usize)>> = HashMap::new();
    for q in 0..n {
        match coll {
            ZcColl::AllReduce { count } => {
                for i in 0..count {
                    expect.insert((q, i), all_in(i));
                }
            }
            ZcColl::Reduce { count, root } => {
                if q == root {
                    for i in 0..count {
                        expect.insert((q, i), all_in(i));
                    }
                }
            }
            ZcColl::ReduceScatter { recv_count } => {
                for i in 0..recv_count {
                    expect.insert((q, i), all_in(q * recv_count + i));
                }
            }
            ZcColl::AllGather { send_count } => {
                for p in 0..n {
                    for i in 0..send_count {
                        expect.insert((q, p * send_count + i), vec![(ZcBuf::In(p), i)]);
                    }
                }
            }
            ZcColl::Broadcast { count, root, .. } => {
                for i in 0..count {
                    expect.insert((q, i), vec![(ZcBuf::In(root), i)]);
                }
            }
            ZcColl::Gather { count, root } => {
                if q == root {
                    for p in 0..n {
                        for i in 0..count {
                            expect.insert((q, p * count + i), vec![(ZcBuf::In(p), i)]);
                        }
                    }
                }
            }
            ZcColl::Scatter { count, root } => {
                for i in 0..count {
                    expect.insert((q, i), vec![(ZcBuf::In(root), q * count + i)]);
                }
            }
            ZcColl::AllToAll { count } | ZcColl::AllToAllInPlace { count } => {
                for p in 0..n {
                    for i in 0..count {
                        expect.insert((q, p * count + i), vec![(ZcBuf::In(p), q * count + i)]);
                    }
                }
            }
        }
    }
    if written != expect {
        let missing = expect.keys().find(|k| !written.contains_key(k));
        let wrong = written.iter().find(|(k, v)| expect.get(k) != Some(v));
        return Err(format!(
            "{coll:?} at {n} ranks: missing {missing:?}, wrong {wrong:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
