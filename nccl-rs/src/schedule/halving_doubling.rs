//! Recursive halving-doubling all-reduce (Rabenseifner's algorithm): a
//! reduce-scatter by recursive halving, then an all-gather by recursive
//! doubling. `2·log2(p)` message latencies (`p` as below; two more with
//! extra ranks) instead of the ring's `2(n-1)`,
//! with the ring's `2(n-1)/n · S` bytes per rank — the middle ground between
//! the direct exchange (tiny messages) and the pipelined ring (large ones).
//!
//! # Core and extra ranks
//! The halving and doubling need a power of two: `p = 2^⌊log2 n⌋` core
//! ranks. Each of the `e = n - p` extra ranks (the even ranks below `2e`)
//! folds its whole input into its partner (the next, odd rank) first and gets
//! the finished result back from it at the end, as in MPICH's
//! implementation. Core rank `v` (0..p) is rank `2v+1` for `v < e`, else
//! `v + e`.
//!
//! # Halving and doubling
//! The buffer is cut into `p` nearly equal blocks (see
//! [`part_start`](super::part_start)). Core rank `v` starts with the window of
//! all `p` blocks. At the step with mask `m = p/2, p/4, …, 1` it splits the
//! window in two halves of `m` blocks, keeps the half that `v & m` selects,
//! sends its partial sums of the other half to `v ^ m` and reduces the
//! partner's partial sums of its own half into `Out`. After the last step
//! it holds block `v` fully reduced (the only reduction that finishes an
//! element, so `Avg`'s division happens once). The doubling replays the
//! masks in reverse, swapping finished windows, so every rank ends with the
//! same bits: each element is reduced once, by its owner, and only copied
//! afterwards.
//!
//! # Chunks and order
//! Every exchange is cut into chunks of at most `chunk` elements (one
//! staging slot each); a rank's sends to its partner run `LEAD` chunks ahead
//! of its receives, so the next chunks are on the wire while one is reduced.
//! The middle exchange (mask 1) is fused: each chunk of the own block goes
//! back to the partner as soon as it is reduced, as in the ring.
//! The fold is pipelined into the first halving step (the partner folds and
//! forwards in one `RecvReduceCopySend`), and the result flows back to the
//! extra rank during the doubling (each finished window is forwarded with
//! `RecvCopySend`). An extra rank's schedule is derived from its partner's,
//! so their messages match by construction.
//!
//! # Memory
//! In place (`In` is `Out`) is safe: a core rank writes a range of `Out` by
//! a direct receive only in the doubling, and the data comes from the
//! partner that first had to receive this rank's partial sums of that range,
//! so every earlier local read of it is finished (the engine's causality
//! rule). An extra rank receives only results its partner computed after
//! receiving all of the extra rank's input.

use super::{part_start, Loc, Schedule, Step};

/// Chunks a rank's sends run ahead of its receives in one exchange.
const LEAD: usize = 2;

/// The largest power of two not above `n` (0 for 0).
pub fn core_size(n: usize) -> usize {
    match n {
        0 => 0,
        _ => 1 << (usize::BITS - 1 - n.leading_zeros()),
    }
}

/// What a rank does.
enum Role {
    /// Folds into and gets the result from the core rank `partner`.
    Extra { partner: usize },
    /// Core rank `v`, serving the extra rank `extra` if any.
    Core { v: usize, extra: Option<usize> },
}

fn role(n: usize, r: usize) -> Role {
    let e = n - core_size(n);
    if r >= 2 * e {
        Role::Core {
            v: r - e,
            extra: None,
        }
    } else if r & 1 == 0 {
        Role::Extra { partner: r + 1 }
    } else {
        Role::Core {
            v: r / 2,
            extra: Some(r - 1),
        }
    }
}

/// The rank of core rank `v`.
fn rank_of(n: usize, v: usize) -> usize {
    let e = n - core_size(n);
    if v < e {
        2 * v + 1
    } else {
        v + e
    }
}

/// An element range `(start, len)`.
type Range = (usize, usize);

/// One halving step of core rank `v`: the mask, the kept and the given-away
/// element ranges.
struct Half {
    mask: usize,
    keep: Range,
    give: Range,
}

/// The halving steps of core rank `v` of `p`, largest mask first.
fn halving(count: usize, p: usize, v: usize) -> Vec<Half> {
    let range = |lo: usize, hi: usize| {
        let s = part_start(count, p, lo);
        (s, part_start(count, p, hi) - s)
    };
    let (mut lo, mut hi) = (0, p);
    let mut steps = Vec::new();
    let mut mask = p / 2;
    while mask > 0 {
        let mid = lo + mask;
        let (keep, give) = if v & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        steps.push(Half {
            mask,
            keep: range(keep.0, keep.1),
            give: range(give.0, give.1),
        });
        (lo, hi) = keep;
        mask /= 2;
    }
    steps
}

/// The chunks of a range, each at most `chunk` long.
fn chunks((start, len): Range, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len.div_ceil(chunk)).map(move |k| {
        let o = start + k * chunk;
        (o, chunk.min(start + len - o))
    })
}

/// One exchange with a partner, ordered as a wavefront: group `i` of
/// phase `j` (0: send, 1: receive and reduce, 2: receive the result) gets
/// the key `(i + j·LEAD, i)`. A message sent under key `(K, i)` is received
/// under `(K + LEAD, i)` on the other side, so both sides order each link
/// alike while sends run `LEAD` chunks ahead of receives.
#[derive(Default)]
struct Wave(Vec<((usize, usize), Vec<Step>)>);

impl Wave {
    fn push(&mut self, i: usize, phase: usize, group: Vec<Step>) {
        self.0.push(((i + phase * LEAD, i), group));
    }

    fn finish(mut self) -> impl Iterator<Item = Step> {
        self.0.sort_by_key(|(k, _)| *k);
        self.0.into_iter().flat_map(|(_, g)| g)
    }
}

/// Halving-doubling all-reduce of `count` elements for rank `r` of `n`, in
/// chunks of at most `chunk` elements.
pub fn all_reduce_halving_doubling(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    let chunk = chunk.max(1);
    let steps = if n <= 1 {
        let copy = Step::Copy {
            src: Loc::In(0),
            dst: Loc::Out(0),
            count,
        };
        (count > 0).then_some(copy).into_iter().collect()
    } else {
        match role(n, r) {
            Role::Core { v, extra } => core(n, v, extra, count, chunk),
            Role::Extra { partner } => extra(n, r, partner, count, chunk),
        }
    };
    Schedule { steps, scratch: 0 }
}

/// The steps of core rank `v` (`n >= 2`). The last halving exchange
/// (mask 1) and the first doubling exchange run fused: each chunk of the
/// own block goes back to the partner as soon as it is reduced.
fn core(n: usize, v: usize, extra: Option<usize>, count: usize, chunk: usize) -> Vec<Step> {
    let halves = halving(count, core_size(n), v);
    let mut out = Vec::new();
    for (s, h) in halves.iter().enumerate() {
        let peer = rank_of(n, v ^ h.mask);
        let (first, last) = (s == 0, s + 1 == halves.len());
        let mut w = Wave::default();
        for (i, (o, count)) in chunks(h.give, chunk).enumerate() {
            let send = match (first, extra) {
                (true, Some(e)) => Step::RecvReduceCopySend {
                    from: e,
                    to: Some(peer),
                    src: Loc::In(o),
                    dst: Loc::Out(o),
                    count,
                    finalize: false,
                },
                (true, None) => Step::Send {
                    to: peer,
                    src: Loc::In(o),
                    count,
                },
                (false, _) => Step::Send {
                    to: peer,
                    src: Loc::Out(o),
                    count,
                },
            };
            w.push(i, 0, vec![send]);
        }
        for (i, (o, count)) in chunks(h.keep, chunk).enumerate() {
            let mut group = Vec::new();
            let mut src = if first { Loc::In(o) } else { Loc::Out(o) };
            if let (true, Some(e)) = (first, extra) {
                group.push(Step::RecvReduceCopySend {
                    from: e,
                    to: None,
                    src,
                    dst: Loc::Out(o),
                    count,
                    finalize: false,
                });
                src = Loc::Out(o);
            }
            group.push(Step::RecvReduceCopySend {
                from: peer,
                to: last.then_some(peer),
                src,
                dst: Loc::Out(o),
                count,
                finalize: last,
            });
            if let (true, Some(e)) = (last, extra) {
                group.push(Step::Send {
                    to: e,
                    src: Loc::Out(o),
                    count,
                });
            }
            w.push(i, 1, group);
        }
        if last {
            for (i, (o, count)) in chunks(h.give, chunk).enumerate() {
                w.push(i, 2, vec![gather_recv(peer, extra, o, count)]);
            }
        }
        out.extend(w.finish());
    }
    for h in halves.iter().rev().skip(1) {
        let peer = rank_of(n, v ^ h.mask);
        let mut w = Wave::default();
        for (i, (o, count)) in chunks(h.keep, chunk).enumerate() {
            let send = Step::Send {
                to: peer,
                src: Loc::Out(o),
                count,
            };
            w.push(i, 0, vec![send]);
        }
        for (i, (o, count)) in chunks(h.give, chunk).enumerate() {
            w.push(i, 1, vec![gather_recv(peer, extra, o, count)]);
        }
        out.extend(w.finish());
    }
    out
}

/// Receives finished elements from `peer` into `Out(o)`, forwarding them to
/// the extra rank if there is one.
fn gather_recv(peer: usize, extra: Option<usize>, o: usize, count: usize) -> Step {
    let dst = Loc::Out(o);
    match extra {
        Some(e) => Step::RecvCopySend {
            from: peer,
            to: e,
            dst,
            count,
        },
        None => Step::Recv {
            from: peer,
            dst,
            count,
        },
    }
}

/// The steps of extra rank `r`: the mirror of every step of its partner
/// that receives from or sends to `r`, in the partner's order.
fn extra(n: usize, r: usize, partner: usize, count: usize, chunk: usize) -> Vec<Step> {
    let Role::Core { v, .. } = role(n, partner) else {
        return Vec::new();
    };
    core(n, v, Some(r), count, chunk)
        .into_iter()
        .filter_map(|s| match s {
            Step::RecvReduceCopySend {
                from,
                src: Loc::In(o),
                count,
                ..
            } if from == r => Some(Step::Send {
                to: partner,
                src: Loc::In(o),
                count,
            }),
            Step::Send {
                to,
                src: Loc::Out(o),
                count,
            }
            | Step::RecvCopySend {
                to,
                dst: Loc::Out(o),
                count,
                ..
            } if to == r => Some(Step::Recv {
                from: partner,
                dst: Loc::Out(o),
                count,
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_and_extra_ranks_pair_up() {
        for n in 1..=130 {
            let p = core_size(n);
            assert!(p <= n && n < 2 * p, "n={n}");
            let mut seen = vec![false; n];
            for v in 0..p {
                let r = rank_of(n, v);
                assert!(!seen[r]);
                seen[r] = true;
                assert!(matches!(role(n, r), Role::Core { v: w, .. } if w == v));
            }
            for (r, core) in seen.iter().enumerate() {
                if !core {
                    let Role::Extra { partner } = role(n, r) else {
                        panic!("n={n} rank {r} is neither core nor extra");
                    };
                    assert!(
                        matches!(role(n, partner), Role::Core { extra: Some(e), .. } if e == r)
                    );
                }
            }
        }
    }

    #[test]
    fn halving_ends_on_own_block_and_uses_log2_steps() {
        for p in [2, 4, 8, 64] {
            for count in [0, 3, 100] {
                for v in 0..p {
                    let h = halving(count, p, v);
                    assert_eq!(h.len(), p.trailing_zeros() as usize);
                    let own = h.last().map(|x| x.keep);
                    let s = part_start(count, p, v);
                    assert_eq!(own, Some((s, part_start(count, p, v + 1) - s)));
                }
            }
        }
    }
}
