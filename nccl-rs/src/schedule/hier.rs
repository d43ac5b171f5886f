//! Hierarchical schedules: `H` hosts of `L` ranks each (a host is the ranks
//! that share memory). Traffic inside a host and between hosts is split so
//! that every byte a host must send or receive crosses the host boundary
//! once, as in NCCL's hierarchical designs.
//!
//! The cluster is described by [`Hosts`]: the ranks of each host in local
//! rank order, the hosts in inter-host ring order. Rank ids are arbitrary
//! (a host's ranks need not be contiguous) but must be exactly `0..H*L`.
//! Every schedule returns `None` when the hosts have unequal sizes or the
//! description is not a permutation of `0..n` (or `r`/`root` is out of
//! range); the planner then falls back to the flat schedules.
//!
//! # Pieces and ordering
//! Each schedule cuts its buffer into pieces (nearly equal, see
//! [`part_start`]) and each piece into slices of at most `chunk` elements;
//! slice `k` of every piece forms round `k`. Within a round the phases
//! (intra-host, inter-host, intra-host) follow each other as consecutive
//! ring steps `s`, and every step gets the key `(k + s, k, sub)` (`sub`
//! tells apart the per-host sub-rounds of an intra-host phase). A message
//! sent at step `s` is received at step `s + 1` of the peer, under the same
//! `k` and `sub`, and every rank has the same phase layout (hosts are of
//! equal size), so both ends of a link order its messages alike, the
//! receive's key is above the send's (no deadlock) and the rounds overlap
//! as a wavefront, as in `ring.rs`. (The broadcast sends each slice along
//! fixed chains, in slice order; the tree all-reduce uses `tree.rs`'s
//! keys.)
//!
//! # In-place calls
//! The engine may run a call with `In` and `Out` aliased the way NCCL's
//! in-place calls alias them: the same memory (all-reduce, broadcast),
//! `Out = In + r·recv_count` (reduce-scatter) and `In = Out + r·send_count`
//! (all-gather). These schedules rely on three rules, the same the ring
//! schedules follow: an input element is read (by a local step or a send)
//! no later than the step that first writes its aliased output element, and
//! a step that writes it reads it as its own operand (`src == dst`); a
//! receive into `Out` only ever targets memory whose earlier local uses
//! were sent on before the data could exist (causality: the incoming value
//! includes this rank's contribution); and reductions land in staging
//! slots, never in user memory before their step. The tests check these
//! with a symbolic run that lands every receive as soon as its data is sent
//! and reads every send only when the peer takes it.

use super::tree::all_reduce_trees;
use super::{dtree, part_len, part_start, Loc, Schedule, Step, Tree};

/// The hosts of a cluster: `ranks[h]` lists host `h`'s ranks in local-rank
/// order; hosts are listed in inter-host ring order.
#[derive(Clone, Copy, Debug)]
pub struct Hosts<'a> {
    /// The ranks of each host.
    pub ranks: &'a [Vec<usize>],
}

impl Hosts<'_> {
    /// `(H, L)`: hosts and ranks per host, if every host has the same
    /// nonzero size and the ranks are exactly `0..H*L`.
    pub fn shape(&self) -> Option<(usize, usize)> {
        let h = self.ranks.len();
        let l = self.ranks.first()?.len();
        if l == 0 || self.ranks.iter().any(|v| v.len() != l) {
            return None;
        }
        let n = h.checked_mul(l)?;
        let mut seen = vec![false; n];
        for &x in self.ranks.iter().flatten() {
            if x >= n || std::mem::replace(&mut seen[x], true) {
                return None;
            }
        }
        Some((h, l))
    }

    /// `(host, local rank)` of rank `r`.
    pub fn locate(&self, r: usize) -> Option<(usize, usize)> {
        self.ranks
            .iter()
            .enumerate()
            .find_map(|(h, v)| v.iter().position(|&x| x == r).map(|l| (h, l)))
    }

    /// Shape and place of `r`, if the description is valid and holds `r`.
    fn place(&self, r: usize) -> Option<Geo<'_>> {
        let (nh, nl) = self.shape()?;
        let (h, l) = self.locate(r)?;
        Some(Geo {
            ranks: self.ranks,
            nh,
            nl,
            h,
            l,
        })
    }
}

/// A validated cluster and one rank's place in it.
struct Geo<'a> {
    ranks: &'a [Vec<usize>],
    nh: usize,
    nl: usize,
    h: usize,
    l: usize,
}

impl Geo<'_> {
    fn rank(&self, h: usize, l: usize) -> usize {
        self.ranks[h % self.nh][l % self.nl]
    }

    fn n(&self) -> usize {
        self.nh * self.nl
    }

    /// The ring through this host's ranks.
    fn host_ring(&self) -> Ring {
        Ring {
            n: self.nl,
            me: self.l,
        }
    }

    /// The ring through the ranks of this local rank on every host.
    fn column_ring(&self) -> Ring {
        Ring {
            n: self.nh,
            me: self.h,
        }
    }
}

/// A position `me` in a ring of `n` positions.
#[derive(Clone, Copy)]
struct Ring {
    n: usize,
    me: usize,
}

impl Ring {
    /// Position `me - j` (mod `n`).
    fn back(self, j: usize) -> usize {
        (self.me + self.n - j % self.n) % self.n
    }
}

/// Elements traffic of one rank in one call: elements sent to ranks of the
/// same host and to ranks of other hosts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Elements sent to ranks on the same host.
    pub intra: usize,
    /// Elements sent to ranks on other hosts.
    pub inter: usize,
}

/// Keyed steps, sorted into the wavefront order (see the module docs).
#[derive(Default)]
struct Wave(Vec<((usize, usize, usize), Step)>);

impl Wave {
    /// Step `s` of round `k`, per-host sub-round `sub`.
    fn push(&mut self, k: usize, s: usize, sub: usize, step: Step) {
        if step.count() > 0 {
            self.0.push(((k + s, k, sub), step));
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

/// Slice `k` of a piece `(start, len)`: `(offset, len)`, len may be 0.
fn slice((start, len): (usize, usize), k: usize, chunk: usize) -> (usize, usize) {
    let o = k * chunk;
    (start + o, len.saturating_sub(o).min(chunk))
}

/// Part `i` of `parts` of the range `(start, len)`.
fn part((start, len): (usize, usize), parts: usize, i: usize) -> (usize, usize) {
    (start + part_start(len, parts, i), part_len(len, parts, i))
}

/// One round of a ring's steps, to push at steps `s0..` of round `k`.
struct Phase<'w> {
    w: &'w mut Wave,
    k: usize,
    s0: usize,
    sub: usize,
}

impl Phase<'_> {
    fn push(&mut self, j: usize, step: Step) {
        self.w.push(self.k, self.s0 + j, self.sub, step);
    }

    /// Ring reduce-scatter (`ring.n` steps): position `p` of the ring ends
    /// with segment `p`, held at `fin`. `seg(q)` is the `(offset, len)` of
    /// segment `q`; the rank's own contribution is at `own`, partial sums go
    /// to `part`; `peer(q)` is the rank at position `q`.
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &mut self,
        ring: Ring,
        peer: impl Fn(usize) -> usize,
        seg: impl Fn(usize) -> (usize, usize),
        own: impl Fn(usize, usize) -> Loc,
        part: impl Fn(usize, usize) -> Loc,
        fin: impl Fn(usize, usize) -> Loc,
        finalize: bool,
    ) {
        let (nx, pv) = (peer(ring.me + 1), peer(ring.me + ring.n - 1));
        let (q, (o, c)) = (ring.back(1), seg(ring.back(1)));
        self.push(
            0,
            Step::Send {
                to: nx,
                src: own(q, o),
                count: c,
            },
        );
        for j in 1..ring.n {
            let q = ring.back(j + 1);
            let (o, c) = seg(q);
            let last = j == ring.n - 1;
            let step = Step::RecvReduceCopySend {
                from: pv,
                to: (!last).then_some(nx),
                src: own(q, o),
                dst: if last { fin(q, o) } else { part(q, o) },
                count: c,
                finalize: last && finalize,
            };
            self.push(j, step);
        }
    }

    /// Ring all-gather (`ring.n` steps) into `Out`: position `p` starts with
    /// segment `p` at `own`; `seg(q)` is segment `q`'s `(offset, len)` in
    /// `Out`.
    fn all_gather(
        &mut self,
        ring: Ring,
        peer: impl Fn(usize) -> usize,
        seg: impl Fn(usize) -> (usize, usize),
        own: Loc,
    ) {
        let (nx, pv) = (peer(ring.me + 1), peer(ring.me + ring.n - 1));
        let c = seg(ring.me).1;
        self.push(
            0,
            Step::Send {
                to: nx,
                src: own,
                count: c,
            },
        );
        self.all_gather_tail(ring, pv, nx, seg);
    }

    /// Ring all-reduce (`2·ring.n - 1` steps) of segments in `Out` (own
    /// contribution at `own`); position `p` completes segment `p`.
    fn all_reduce(
        &mut self,
        ring: Ring,
        peer: impl Fn(usize) -> usize + Copy,
        seg: impl Fn(usize) -> (usize, usize) + Copy,
        own: impl Fn(usize) -> Loc,
    ) {
        let n = ring.n;
        let (nx, pv) = (peer(ring.me + 1), peer(ring.me + n - 1));
        let (o, c) = seg(ring.back(1));
        self.push(
            0,
            Step::Send {
                to: nx,
                src: own(o),
                count: c,
            },
        );
        for j in 1..n {
            let (o, c) = seg(ring.back(j + 1));
            let step = Step::RecvReduceCopySend {
                from: pv,
                to: Some(nx),
                src: own(o),
                dst: Loc::Out(o),
                count: c,
                finalize: j == n - 1,
            };
            self.push(j, step);
        }
        // The completed segments travel on: position `p` completed `p`.
        self.s0 += n - 1;
        self.all_gather_tail(ring, pv, nx, seg);
        self.s0 -= n - 1;
    }

    /// The receiving steps `1..n` of [`Phase::all_gather`].
    fn all_gather_tail(
        &mut self,
        ring: Ring,
        pv: usize,
        nx: usize,
        seg: impl Fn(usize) -> (usize, usize),
    ) {
        for j in 1..ring.n {
            let (o, c) = seg(ring.back(j));
            let dst = Loc::Out(o);
            let step = if j < ring.n - 1 {
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
            self.push(j, step);
        }
    }
}

fn rounds(len: usize, chunk: usize) -> usize {
    len.div_ceil(chunk)
}

/// A copy of `count` elements from `In` to `Out` (a world of one rank).
fn single(count: usize, to: usize) -> Schedule {
    let mut w = Wave::default();
    w.push(
        0,
        0,
        0,
        Step::Copy {
            src: Loc::In(0),
            dst: Loc::Out(to),
            count,
        },
    );
    w.finish(0)
}

/// Hierarchical all-reduce of `count` elements in slices of at most
/// `chunk`: a reduce-scatter inside each host (a ring over the host's
/// ranks; local rank `l` completes block `l` of the host's sum), an
/// all-reduce of block `l` between hosts (a ring through local rank `l` of
/// every host, split into `H` sub-blocks), and an all-gather inside each
/// host. Every rank sends `2·(count - count/L)` elements inside its host and
/// about `2·(count/L)·(H-1)/H` to other hosts.
///
/// The average's division happens once per element: at the end of the
/// inter-host all-reduce, or at the end of the intra-host reduce-scatter
/// when there is one host. `None`: hosts of unequal sizes or an invalid
/// description (see the module docs).
pub fn all_reduce_hier(hosts: Hosts<'_>, r: usize, count: usize, chunk: usize) -> Option<Schedule> {
    let g = hosts.place(r)?;
    if g.n() == 1 {
        return Some(single(count, 0));
    }
    let chunk = chunk.max(1);
    let (nh, nl) = (g.nh, g.nl);
    // Piece (block b, sub-block s): block b of L, sub-block s of H.
    let piece = |b: usize, s: usize| part(part((0, count), nl, b), nh, s);
    let (hr, lr) = (g.host_ring(), g.column_ring());
    // Step layout of one round: intra reduce-scatter, inter all-reduce,
    // intra all-gather.
    let s_inter = if nl > 1 { nl } else { 0 };
    let s_gather = s_inter + if nh > 1 { 2 * nh - 1 } else { 0 };
    let mut w = Wave::default();
    for k in 0..rounds(piece(0, 0).1, chunk) {
        if nl > 1 {
            for s in 0..nh {
                let mut p = Phase {
                    w: &mut w,
                    k,
                    s0: 0,
                    sub: s,
                };
                p.reduce_scatter(
                    hr,
                    |q| g.rank(g.h, q),
                    |b| slice(piece(b, s), k, chunk),
                    |_, o| Loc::In(o),
                    |_, o| Loc::Out(o),
                    |_, o| Loc::Out(o),
                    nh == 1,
                );
            }
        }
        if nh > 1 {
            let own = |o| if nl > 1 { Loc::Out(o) } else { Loc::In(o) };
            let mut p = Phase {
                w: &mut w,
                k,
                s0: s_inter,
                sub: 0,
            };
            p.all_reduce(
                lr,
                |q| g.rank(q, g.l),
                |s| slice(piece(g.l, s), k, chunk),
                own,
            );
        }
        if nl > 1 {
            for s in 0..nh {
                let mut p = Phase {
                    w: &mut w,
                    k,
                    s0: s_gather,
                    sub: s,
                };
                let own = Loc::Out(slice(piece(g.l, s), k, chunk).0);
                p.all_gather(
                    hr,
                    |q| g.rank(g.h, q),
                    |b| slice(piece(b, s), k, chunk),
                    own,
                );
            }
        }
    }
    Some(w.finish(0))
}

/// What rank `r` sends in [`all_reduce_hier`] of `count` elements.
pub fn all_reduce_hier_traffic(hosts: Hosts<'_>, r: usize, count: usize) -> Option<Traffic> {
    let g = hosts.place(r)?;
    let (nh, nl) = (g.nh, g.nl);
    let block = |b: usize| part_len(count, nl, b % nl);
    let mut t = Traffic::default();
    if nl > 1 {
        // Reduce-scatter: every block but its own; all-gather: every block
        // but the one its successor completes (the last one received).
        t.intra = 2 * count - block(g.l) - block(g.l + 1);
    }
    if nh > 1 {
        // Ring all-reduce of its block: every sub-block once reducing, all
        // but two once gathering.
        let (b, sub) = (block(g.l), |s: usize| part_len(block(g.l), nh, s % nh));
        t.inter = 2 * b - sub(g.h) - sub(g.h + 1);
    }
    Some(t)
}

/// Hierarchical reduce-scatter: the input holds `n·recv_count` elements,
/// segment `q` (at `q·recv_count`) belongs to rank `q`; rank `r`'s output
/// is segment `r` reduced over all ranks.
///
/// Inside each host first, a ring reduce-scatter over the host's ranks
/// hands local rank `l` the host's partial sums of the segments of local
/// rank `l` of every host; then a ring reduce-scatter through local rank
/// `l` of every host completes each of those segments on its owner. A host
/// thus sends each other host the segments of that host's ranks once, and
/// already reduced over its own ranks: `L·(H-1)·recv_count` elements leave
/// a host, the least possible (each of the `(H-1)·L` foreign segments needs
/// this host's contribution, and one sum of it suffices). Reducing between
/// hosts first would send unreduced data `L` times over. Partial sums live
/// in scratch (`n·recv_count` elements).
pub fn reduce_scatter_hier(
    hosts: Hosts<'_>,
    r: usize,
    recv_count: usize,
    chunk: usize,
) -> Option<Schedule> {
    let g = hosts.place(r)?;
    if g.n() == 1 {
        return Some(single(recv_count, 0));
    }
    let chunk = chunk.max(1);
    let (nh, nl) = (g.nh, g.nl);
    let at = |q: usize, o: usize| q * recv_count + o;
    let s_inter = if nl > 1 { nl } else { 0 };
    let mut w = Wave::default();
    for k in 0..rounds(recv_count, chunk) {
        let (o, c) = slice((0, recv_count), k, chunk);
        if nl > 1 {
            // Sub-round s: the segments of host s's ranks.
            for s in 0..nh {
                let mut p = Phase {
                    w: &mut w,
                    k,
                    s0: 0,
                    sub: s,
                };
                p.reduce_scatter(
                    g.host_ring(),
                    |q| g.rank(g.h, q),
                    |b| (at(g.rank(s, b), o), c),
                    |_, x| Loc::In(x),
                    |_, x| Loc::Scratch(x),
                    |_, x| {
                        if nh == 1 {
                            Loc::Out(o)
                        } else {
                            Loc::Scratch(x)
                        }
                    },
                    nh == 1,
                );
            }
        }
        if nh > 1 {
            let mut p = Phase {
                w: &mut w,
                k,
                s0: s_inter,
                sub: 0,
            };
            p.reduce_scatter(
                g.column_ring(),
                |q| g.rank(q, g.l),
                |s| (at(g.rank(s, g.l), o), c),
                |_, x| if nl > 1 { Loc::Scratch(x) } else { Loc::In(x) },
                |_, x| Loc::Scratch(x),
                |_, _| Loc::Out(o),
                true,
            );
        }
    }
    Some(w.finish(g.n() * recv_count))
}

/// What rank `r` sends in [`reduce_scatter_hier`].
pub fn reduce_scatter_hier_traffic(
    hosts: Hosts<'_>,
    r: usize,
    recv_count: usize,
) -> Option<Traffic> {
    let g = hosts.place(r)?;
    Some(Traffic {
        intra: g.nh * (g.nl - 1) * recv_count,
        inter: (g.nh - 1) * recv_count,
    })
}

/// Hierarchical all-gather of `send_count` elements per rank into
/// `n·send_count` (rank `q`'s block at `q·send_count`): first a ring
/// all-gather through local rank `l` of every host (each rank then holds
/// the blocks of its column), then a ring all-gather inside each host of
/// those `H` blocks per rank. Each foreign block enters a host once:
/// `(n - L)·send_count` elements per host, the least possible. Gathering
/// inside hosts first moves as few bytes between hosts only if each rank
/// then forwards just its own column, which is the same traffic; this
/// order starts the slower inter-host links first.
pub fn all_gather_hier(
    hosts: Hosts<'_>,
    r: usize,
    send_count: usize,
    chunk: usize,
) -> Option<Schedule> {
    let g = hosts.place(r)?;
    let chunk = chunk.max(1);
    let (nh, nl) = (g.nh, g.nl);
    let s_intra = if nh > 1 { nh } else { 0 };
    let mut w = Wave::default();
    for k in 0..rounds(send_count, chunk) {
        let (o, c) = slice((0, send_count), k, chunk);
        let at = |q: usize| (q * send_count + o, c);
        if nh > 1 {
            let mut p = Phase {
                w: &mut w,
                k,
                s0: 0,
                sub: 0,
            };
            p.all_gather(
                g.column_ring(),
                |q| g.rank(q, g.l),
                |s| at(g.rank(s, g.l)),
                Loc::In(o),
            );
        }
        // The own block's copy, while the first send travels.
        w.push(
            k,
            0,
            usize::MAX,
            Step::Copy {
                src: Loc::In(o),
                dst: Loc::Out(at(r).0),
                count: c,
            },
        );
        if nl > 1 {
            for s in 0..nh {
                let mut p = Phase {
                    w: &mut w,
                    k,
                    s0: s_intra,
                    sub: s,
                };
                // Its own block is read from the input: no wait on the copy.
                let own = match s == g.h {
                    true => Loc::In(o),
                    false => Loc::Out(at(g.rank(s, g.l)).0),
                };
                p.all_gather(g.host_ring(), |q| g.rank(g.h, q), |b| at(g.rank(s, b)), own);
            }
        }
    }
    Some(w.finish(0))
}

/// What rank `r` sends in [`all_gather_hier`].
pub fn all_gather_hier_traffic(hosts: Hosts<'_>, r: usize, send_count: usize) -> Option<Traffic> {
    let g = hosts.place(r)?;
    Some(Traffic {
        intra: g.nh * (g.nl - 1) * send_count,
        inter: (g.nh - 1) * send_count,
    })
}

/// Where a rank stands in [`broadcast_hier`]: previous and next rank on the
/// inter-host chain (leaders only) and on its host's chain.
struct BcastPlace {
    from: Option<usize>,
    next_host: Option<usize>,
    next_local: Option<usize>,
}

fn bcast_place(g: &Geo<'_>, root: usize, hosts: &Hosts<'_>) -> Option<BcastPlace> {
    let (hr, lr) = hosts.locate(root)?;
    let (nh, nl) = (g.nh, g.nl);
    let hp = (g.h + nh - hr) % nh; // position on the inter-host chain
    let lp = (g.l + nl - lr) % nl; // position on the host's chain
    let leader = lp == 0;
    let from = match (leader, hp) {
        (true, 0) => None,
        (true, _) => Some(g.rank(g.h + nh - 1, lr)),
        (false, _) => Some(g.rank(g.h, g.l + nl - 1)),
    };
    Some(BcastPlace {
        from,
        next_host: (leader && hp + 1 < nh).then(|| g.rank(g.h + 1, lr)),
        next_local: (lp + 1 < nl).then(|| g.rank(g.h, g.l + 1)),
    })
}

/// Hierarchical broadcast of `count` elements from `root`, pipelined in
/// slices of at most `chunk`: the rank with the root's local rank on each
/// host (its leader) is a link of a chain through the hosts, starting at
/// the root's host; each leader forwards a slice to the next host first,
/// then down a chain through its own host's ranks. Each host receives the
/// data once.
pub fn broadcast_hier(
    hosts: Hosts<'_>,
    r: usize,
    root: usize,
    count: usize,
    chunk: usize,
) -> Option<Schedule> {
    let g = hosts.place(r)?;
    let me = bcast_place(&g, root, &hosts)?;
    let chunk = chunk.max(1);
    let mut w = Wave::default();
    for k in 0..rounds(count, chunk) {
        let (o, c) = slice((0, count), k, chunk);
        let mut steps = Vec::new();
        let src = match me.from {
            None => Loc::In(o),
            Some(_) => Loc::Out(o),
        };
        let mut sends = me.next_host.into_iter().chain(me.next_local);
        match me.from {
            // The root sends first, then copies while the data travels.
            None => {
                steps.extend(sends.map(|to| Step::Send { to, src, count: c }));
                steps.push(Step::Copy {
                    src: Loc::In(o),
                    dst: Loc::Out(o),
                    count: c,
                });
            }
            Some(from) => {
                steps.push(match sends.next() {
                    Some(to) => Step::RecvCopySend {
                        from,
                        to,
                        dst: Loc::Out(o),
                        count: c,
                    },
                    None => Step::Recv {
                        from,
                        dst: Loc::Out(o),
                        count: c,
                    },
                });
                steps.extend(sends.map(|to| Step::Send { to, src, count: c }));
            }
        }
        for (i, s) in steps.into_iter().enumerate() {
            w.push(k, 0, i, s);
        }
    }
    Some(w.finish(0))
}

/// What rank `r` sends in [`broadcast_hier`].
pub fn broadcast_hier_traffic(
    hosts: Hosts<'_>,
    r: usize,
    root: usize,
    count: usize,
) -> Option<Traffic> {
    let g = hosts.place(r)?;
    let me = bcast_place(&g, root, &hosts)?;
    Some(Traffic {
        intra: me.next_local.map_or(0, |_| count),
        inter: me.next_host.map_or(0, |_| count),
    })
}

/// Rank `r`'s places in the two trees of [`all_reduce_tree_hier`].
fn hier_trees(g: &Geo<'_>) -> [Tree; 2] {
    let (t1, t2) = dtree(g.nh, g.h);
    let (nl, l) = (g.nl, g.l);
    let mk = |t: usize, host: Tree| {
        // Tree 0's chain runs 0 → L-1 with local rank 0 as the host's
        // leader; tree 1's runs the other way, so each intra-host link
        // carries one tree's reduction and the other's broadcast.
        let local = |p: usize| if t == 0 { p } else { nl - 1 - p };
        let p = local(l);
        let leader = |h: usize| g.rank(h, local(0));
        if p == 0 {
            let mut children: Vec<usize> = host.children.iter().map(|&h| leader(h)).collect();
            if nl > 1 {
                children.push(g.rank(g.h, local(1)));
            }
            Tree {
                parent: host.parent.map(leader),
                children,
            }
        } else {
            Tree {
                parent: Some(g.rank(g.h, local(p - 1))),
                children: (p + 1 < nl)
                    .then(|| g.rank(g.h, local(p + 1)))
                    .into_iter()
                    .collect(),
            }
        }
    };
    [mk(0, t1), mk(1, t2)]
}

/// NCCL's tree all-reduce shape: a chain through the ranks of each host,
/// and between hosts a double binary tree ([`dtree`] over host indices)
/// whose nodes are the hosts' chain heads. Tree `t` carries half `t` of the
/// buffer, reduced up and broadcast down in chunks of `chunk`, as
/// [`all_reduce_tree`](super::all_reduce_tree) does; tree 0's chains start
/// at local rank 0, tree 1's at local rank `L-1`.
pub fn all_reduce_tree_hier(
    hosts: Hosts<'_>,
    r: usize,
    count: usize,
    chunk: usize,
) -> Option<Schedule> {
    let g = hosts.place(r)?;
    if g.n() == 1 {
        return Some(single(count, 0));
    }
    let [a, b] = hier_trees(&g);
    Some(all_reduce_trees([&a, &b], count, chunk))
}

/// What rank `r` sends in [`all_reduce_tree_hier`].
pub fn all_reduce_tree_hier_traffic(hosts: Hosts<'_>, r: usize, count: usize) -> Option<Traffic> {
    let g = hosts.place(r)?;
    let mut t = Traffic::default();
    if g.n() == 1 {
        return Some(t);
    }
    let host_of = |q: usize| hosts.locate(q).map(|p| p.0);
    for (i, tree) in hier_trees(&g).iter().enumerate() {
        let len = part_len(count, 2, i);
        for peer in tree.parent.iter().chain(&tree.children) {
            match host_of(*peer)? == g.h {
                true => t.intra += len,
                false => t.inter += len,
            }
        }
    }
    Some(t)
}

#[cfg(test)]
mod tests;
