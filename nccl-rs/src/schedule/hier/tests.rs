//! The hierarchical schedules at many cluster shapes (1..=5 hosts of 1..=4
//! ranks, host rank lists contiguous, interleaved and scrambled):
//! per-link matching, the symbolic dataflow run proving what every output
//! element holds (out of place and in place), a stricter symbolic run with
//! the engine's freedoms (receives landing as soon as the data is sent,
//! sends read as late as the receiver takes them), real engine runs over
//! the in-memory transport with exact integer sums and averages and
//! bit-identical float averages, and the traffic helpers against the
//! schedules' own steps.
// Loops over ranks read as the math does (`for r in 0..n`, `b[r]`).
#![allow(clippy::needless_range_loop)]

use super::*;
use crate::datatype::{DataType, RedOp};
use crate::engine::Region;
use crate::schedule::check::{check_matching, simulate, SymBufs, Val};
use crate::testing::{drive_engines, engine_mesh};
use crate::transport::mem::MemNet;
use std::collections::VecDeque;

const COUNTS: &[usize] = &[0, 1, 7, 1000];
const CHUNKS: &[usize] = &[1, 3, 64, 1 << 20];

/// The (count, chunk) pairs of the symbolic runs: every pair but the
/// slowest (a thousand one-element slices).
fn sizes() -> impl Iterator<Item = (usize, usize)> {
    COUNTS
        .iter()
        .flat_map(|&c| CHUNKS.iter().map(move |&ch| (c, ch)))
        .filter(|&(c, ch)| !(c >= 1000 && ch == 1))
}

/// Host rank lists for `nh` hosts of `nl` ranks: contiguous (`h·L + l`),
/// interleaved (rank `r` on host `r % H`) and scrambled (the interleaved
/// ids reversed).
fn layouts(nh: usize, nl: usize) -> Vec<(&'static str, Vec<Vec<usize>>)> {
    let n = nh * nl;
    let mk = |f: &dyn Fn(usize, usize) -> usize| -> Vec<Vec<usize>> {
        (0..nh)
            .map(|h| (0..nl).map(|l| f(h, l)).collect())
            .collect()
    };
    vec![
        ("contiguous", mk(&|h, l| h * nl + l)),
        ("interleaved", mk(&|h, l| l * nh + h)),
        ("scrambled", mk(&|h, l| n - 1 - (l * nh + h))),
    ]
}

/// Every shape and layout the symbolic tests cover.
fn shapes() -> Vec<(usize, usize, &'static str, Vec<Vec<usize>>)> {
    let mut v = Vec::new();
    for nh in 1..=5 {
        for nl in 1..=4 {
            for (name, hosts) in layouts(nh, nl) {
                v.push((nh, nl, name, hosts));
            }
        }
    }
    v
}

fn v(rank: usize, index: usize) -> Option<Val> {
    Some(Val {
        ranks: 1 << rank,
        index: index as u64,
    })
}

fn all(n: usize) -> u128 {
    (1u128 << n) - 1
}

/// How `In` and `Out` alias in an in-place call of rank `r`.
#[derive(Clone, Copy, Debug)]
enum Alias {
    /// Separate buffers.
    None,
    /// `In` is `Out` (all-reduce, broadcast).
    Same,
    /// `Out` is `In + at` (reduce-scatter).
    OutInIn(usize),
    /// `In` is `Out + at` (all-gather).
    InInOut(usize),
}

/// The schedule as the engine runs it with `alias`: every location
/// rewritten into the one buffer that holds it.
fn aliased(mut s: Schedule, alias: Alias) -> Schedule {
    let fix = |l: &mut Loc| {
        *l = match (alias, *l) {
            (Alias::Same, Loc::In(o)) => Loc::Out(o),
            (Alias::OutInIn(at), Loc::Out(o)) => Loc::In(at + o),
            (Alias::InInOut(at), Loc::In(o)) => Loc::Out(at + o),
            (_, l) => l,
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

/// How the stricter run takes the engine's freedoms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A receive straight into memory lands the moment its data is sent
    /// (the engine posts receives ahead of the executing step).
    EarlyLanding,
    /// A send reads its memory only when the receiver takes the data (sends
    /// complete in the background).
    LateRead,
}

fn loc_buf(b: &mut SymBufs, l: Loc) -> Result<(&mut Vec<Option<Val>>, usize), String> {
    match l {
        Loc::In(o) => Ok((&mut b.input, o)),
        Loc::Out(o) => Ok((&mut b.output, o)),
        Loc::Scratch(o) => Ok((&mut b.scratch, o)),
        Loc::Group(..) => Err("group buffer".into()),
    }
}

fn rd(b: &mut SymBufs, l: Loc, c: usize) -> Result<Vec<Val>, String> {
    let (v, o) = loc_buf(b, l)?;
    let s = v
        .get(o..o + c)
        .ok_or(format!("read {l:?}+{c} out of bounds"))?;
    s.iter()
        .map(|x| x.ok_or(format!("read of unwritten {l:?}")))
        .collect()
}

fn wr(b: &mut SymBufs, l: Loc, vals: &[Val]) -> Result<(), String> {
    let (v, o) = loc_buf(b, l)?;
    let s = v
        .get_mut(o..o + vals.len())
        .ok_or(format!("write {l:?} out of bounds"))?;
    for (d, x) in s.iter_mut().zip(vals) {
        *d = Some(*x);
    }
    Ok(())
}

fn combine(a: &[Val], b: &[Val]) -> Result<Vec<Val>, String> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.index != y.index || x.ranks & y.ranks != 0 {
                Err(format!("bad reduction of {x:?} with {y:?}"))
            } else {
                Ok(Val {
                    ranks: x.ranks | y.ranks,
                    index: x.index,
                })
            }
        })
        .collect()
}

/// A message on a link.
enum Msg {
    /// Data read when sent.
    Vals(Vec<Val>),
    /// Already written into the receiver's destination.
    Landed,
    /// To be read from the sender's memory when received.
    Ref(Loc, usize),
}

/// Whether a reduction's `finalize` is right: set exactly when its result
/// holds every rank's contribution, so an average divides each value once.
fn check_finalize(x: &[Val], finalize: bool, n: usize) -> Result<(), String> {
    match x.iter().find(|v| (v.ranks == all(n)) != finalize) {
        Some(v) => Err(format!("finalize={finalize} on {v:?}")),
        None => Ok(()),
    }
}

/// Runs the schedules like [`simulate`], but with the engine's freedoms
/// taken as far as they go (see [`Mode`]): a schedule that relies on a
/// receive not landing early, or on sent memory not changing before the
/// peer takes it, ends with different outputs or fails a reduction. Also
/// checks every reduction's `finalize` ([`check_finalize`]).
fn simulate_strict(scheds: &[Schedule], bufs: &mut [SymBufs], mode: Mode) -> Result<(), String> {
    let n = scheds.len();
    for (b, s) in bufs.iter_mut().zip(scheds) {
        b.scratch = vec![None; s.scratch];
    }
    // The receiving steps of each link, in order.
    let mut recvs: Vec<VecDeque<usize>> = vec![VecDeque::new(); n * n];
    for (r, s) in scheds.iter().enumerate() {
        for (i, step) in s.steps.iter().enumerate() {
            if let Some(from) = step.recv_peer() {
                recvs[from * n + r].push_back(i);
            }
        }
    }
    let mut links: Vec<VecDeque<Msg>> = (0..n * n).map(|_| VecDeque::new()).collect();
    let mut pc = vec![0usize; n];
    loop {
        let mut moved = false;
        for r in 0..n {
            while let Some(&step) = scheds[r].steps.get(pc[r]) {
                let incoming = match step.recv_peer() {
                    Some(from) => match links[from * n + r].pop_front() {
                        None => break,
                        Some(Msg::Vals(m)) => Some(m),
                        Some(Msg::Landed) => None,
                        Some(Msg::Ref(l, c)) => Some(rd(&mut bufs[from], l, c)?),
                    },
                    None => None,
                };
                let b = &mut bufs[r];
                // What this step sends: (memory, count).
                let sent = match step {
                    Step::Send { src, count, .. } => Some((src, count)),
                    Step::Recv { dst, .. } => {
                        if let Some(m) = incoming {
                            wr(b, dst, &m)?;
                        }
                        None
                    }
                    Step::RecvCopySend { dst, count, .. } => {
                        if let Some(m) = incoming {
                            wr(b, dst, &m)?;
                        }
                        Some((dst, count))
                    }
                    Step::RecvReduceCopySend {
                        src,
                        dst,
                        count,
                        to,
                        finalize,
                        ..
                    } => {
                        let m = incoming.ok_or("reduction of landed data")?;
                        let x = combine(&rd(b, src, count)?, &m)?;
                        check_finalize(&x, finalize, n)?;
                        wr(b, dst, &x)?;
                        to.map(|_| (dst, count))
                    }
                    Step::Copy { src, dst, count } => {
                        let x = rd(b, src, count)?;
                        wr(b, dst, &x)?;
                        None
                    }
                    Step::Reduce {
                        src,
                        dst,
                        count,
                        finalize,
                    } => {
                        let x = combine(&rd(b, dst, count)?, &rd(b, src, count)?)?;
                        check_finalize(&x, finalize, n)?;
                        wr(b, dst, &x)?;
                        None
                    }
                };
                if let (Some(to), Some((l, c))) = (step.send_peer(), sent) {
                    let at = recvs[r * n + to]
                        .pop_front()
                        .ok_or(format!("{r} -> {to}: no receive"))?;
                    let msg = match (mode, scheds[to].steps[at]) {
                        (
                            Mode::EarlyLanding,
                            Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. },
                        ) => {
                            let x = rd(&mut bufs[r], l, c)?;
                            wr(&mut bufs[to], dst, &x)?;
                            Msg::Landed
                        }
                        (Mode::EarlyLanding, _) => Msg::Vals(rd(&mut bufs[r], l, c)?),
                        (Mode::LateRead, _) => Msg::Ref(l, c),
                    };
                    links[r * n + to].push_back(msg);
                }
                pc[r] += 1;
                moved = true;
            }
        }
        if (0..n).all(|r| pc[r] == scheds[r].steps.len()) {
            return Ok(());
        }
        if !moved {
            return Err(format!("deadlock at pcs {pc:?}"));
        }
    }
}

/// Runs `sched` for every rank (with `alias(r)`), in the plain symbolic
/// run and both strict modes; checks that the three agree and returns the
/// buffers. `input(r)` and `output(r)` are the initial buffers.
fn run(
    n: usize,
    sched: impl Fn(usize) -> Schedule,
    alias: impl Fn(usize) -> Alias,
    input: impl Fn(usize) -> Vec<Option<Val>>,
    output: impl Fn(usize) -> Vec<Option<Val>>,
    what: &str,
) -> Vec<SymBufs> {
    let scheds: Vec<_> = (0..n).map(|r| aliased(sched(r), alias(r))).collect();
    check_matching(&scheds).unwrap_or_else(|e| panic!("{what}: {e}"));
    let fresh = || -> Vec<SymBufs> {
        (0..n)
            .map(|r| SymBufs {
                input: input(r),
                output: output(r),
                scratch: vec![],
            })
            .collect()
    };
    let mut plain = fresh();
    simulate(&scheds, &mut plain).unwrap_or_else(|e| panic!("{what}: {e}"));
    for mode in [Mode::EarlyLanding, Mode::LateRead] {
        let mut b = fresh();
        simulate_strict(&scheds, &mut b, mode).unwrap_or_else(|e| panic!("{what} {mode:?}: {e}"));
        for r in 0..n {
            assert_eq!(b[r].input, plain[r].input, "{what} {mode:?} rank {r} input");
            assert_eq!(b[r].output, plain[r].output, "{what} {mode:?} rank {r}");
        }
    }
    plain
}

fn expect(got: &[Option<Val>], want: impl Fn(usize) -> Val, what: &str) {
    for (i, x) in got.iter().enumerate() {
        assert_eq!(*x, Some(want(i)), "{what}: element {i}");
    }
}

/// Runs an all-reduce schedule out of place and in place and checks every
/// element of every rank holds the sum over all ranks.
fn check_all_reduce(n: usize, c: usize, what: &str, sched: impl Fn(usize) -> Schedule + Copy) {
    let own = |r: usize| (0..c).map(|i| v(r, i)).collect::<Vec<_>>();
    let want = |i: usize| Val {
        ranks: all(n),
        index: i as u64,
    };
    let b = run(n, sched, |_| Alias::None, own, |_| vec![None; c], what);
    for r in 0..n {
        expect(&b[r].output, want, &format!("{what} rank {r}"));
    }
    let b = run(n, sched, |_| Alias::Same, |_| vec![], own, what);
    for r in 0..n {
        expect(&b[r].output, want, &format!("{what} in place rank {r}"));
    }
}

#[test]
fn all_reduce_hier_every_element_reduced_once() {
    for (nh, nl, name, hosts) in shapes() {
        let hs = Hosts { ranks: &hosts };
        for (c, ch) in sizes() {
            let what = format!("all_reduce_hier {nh}x{nl} {name} c={c} chunk={ch}");
            check_all_reduce(nh * nl, c, &what, |r| {
                all_reduce_hier(hs, r, c, ch).unwrap()
            });
        }
    }
}

#[test]
fn all_reduce_tree_hier_every_element_reduced_once() {
    for (nh, nl, name, hosts) in shapes() {
        let hs = Hosts { ranks: &hosts };
        for (c, ch) in sizes() {
            let what = format!("all_reduce_tree_hier {nh}x{nl} {name} c={c} chunk={ch}");
            check_all_reduce(nh * nl, c, &what, |r| {
                all_reduce_tree_hier(hs, r, c, ch).unwrap()
            });
        }
    }
}

#[test]
fn reduce_scatter_hier_gives_each_rank_its_segment() {
    for (nh, nl, name, hosts) in shapes() {
        let n = nh * nl;
        let hs = Hosts { ranks: &hosts };
        for (c, ch) in sizes() {
            let what = format!("reduce_scatter_hier {nh}x{nl} {name} c={c} chunk={ch}");
            let sched = |r| reduce_scatter_hier(hs, r, c, ch).unwrap();
            let input = |r: usize| (0..n * c).map(|i| v(r, i)).collect::<Vec<_>>();
            let want = |r: usize| {
                move |i: usize| Val {
                    ranks: all(n),
                    index: (r * c + i) as u64,
                }
            };
            let b = run(n, sched, |_| Alias::None, input, |_| vec![None; c], &what);
            for r in 0..n {
                expect(&b[r].output, want(r), &format!("{what} rank {r}"));
            }
            let b = run(
                n,
                sched,
                |r| Alias::OutInIn(r * c),
                input,
                |_| vec![],
                &what,
            );
            for r in 0..n {
                let got = &b[r].input[r * c..(r + 1) * c];
                expect(got, want(r), &format!("{what} in place rank {r}"));
            }
        }
    }
}

#[test]
fn all_gather_hier_gives_every_rank_every_block() {
    for (nh, nl, name, hosts) in shapes() {
        let n = nh * nl;
        let hs = Hosts { ranks: &hosts };
        for (c, ch) in sizes() {
            let what = format!("all_gather_hier {nh}x{nl} {name} c={c} chunk={ch}");
            let sched = |r| all_gather_hier(hs, r, c, ch).unwrap();
            let want = |i: usize| Val {
                ranks: 1 << (i / c),
                index: i as u64,
            };
            let input = |r: usize| (0..c).map(|i| v(r, r * c + i)).collect::<Vec<_>>();
            let b = run(
                n,
                sched,
                |_| Alias::None,
                input,
                |_| vec![None; n * c],
                &what,
            );
            for r in 0..n {
                expect(&b[r].output, want, &format!("{what} rank {r}"));
            }
            // In place: the rank's own block already sits in the output.
            let output = |r: usize| {
                (0..n * c)
                    .map(|i| if i / c == r { v(r, i) } else { None })
                    .collect::<Vec<_>>()
            };
            let b = run(
                n,
                sched,
                |r| Alias::InInOut(r * c),
                |_| vec![],
                output,
                &what,
            );
            for r in 0..n {
                expect(&b[r].output, want, &format!("{what} in place rank {r}"));
            }
        }
    }
}

#[test]
fn broadcast_hier_from_every_root() {
    for (nh, nl, name, hosts) in shapes() {
        let n = nh * nl;
        let hs = Hosts { ranks: &hosts };
        for (c, ch) in sizes() {
            for root in 0..n {
                let what = format!("broadcast_hier {nh}x{nl} {name} c={c} ch={ch} root={root}");
                let sched = |r| broadcast_hier(hs, r, root, c, ch).unwrap();
                let own = |r: usize| (0..c).map(|i| v(r, i)).collect::<Vec<_>>();
                let want = |i: usize| Val {
                    ranks: 1 << root,
                    index: i as u64,
                };
                let b = run(n, sched, |_| Alias::None, own, |_| vec![None; c], &what);
                for r in 0..n {
                    expect(&b[r].output, want, &format!("{what} rank {r}"));
                }
                let b = run(n, sched, |_| Alias::Same, |_| vec![], own, &what);
                for r in 0..n {
                    expect(&b[r].output, want, &format!("{what} in place rank {r}"));
                }
            }
        }
    }
}

/// The strict run catches the two hazards it models, which the plain run
/// accepts: a receive that an earlier local write would clobber if it
/// landed early, and sent memory overwritten before the peer took it.
#[test]
fn the_strict_run_catches_early_landing_and_late_reads() {
    let input = |r: usize| vec![v(r, 0), v(r, 1)];
    let fresh = || -> Vec<SymBufs> {
        (0..2)
            .map(|r| SymBufs {
                input: input(r),
                output: vec![None; 2],
                scratch: vec![],
            })
            .collect()
    };
    let send = |to, src| Step::Send { to, src, count: 1 };
    let copy = |src, dst| Step::Copy { src, dst, count: 1 };
    // Rank 1 copies into Out(0), then receives into it.
    let clobber = vec![
        Schedule {
            steps: vec![send(1, Loc::In(0))],
            scratch: 0,
        },
        Schedule {
            steps: vec![
                copy(Loc::In(0), Loc::Out(0)),
                Step::Recv {
                    from: 0,
                    dst: Loc::Out(0),
                    count: 1,
                },
            ],
            scratch: 0,
        },
    ];
    // Rank 0 sends Out(0), then overwrites it.
    let overwrite = vec![
        Schedule {
            steps: vec![
                copy(Loc::In(0), Loc::Out(0)),
                send(1, Loc::Out(0)),
                copy(Loc::In(1), Loc::Out(0)),
            ],
            scratch: 0,
        },
        Schedule {
            steps: vec![Step::Recv {
                from: 0,
                dst: Loc::Out(0),
                count: 1,
            }],
            scratch: 0,
        },
    ];
    for (scheds, mode) in [(clobber, Mode::EarlyLanding), (overwrite, Mode::LateRead)] {
        let mut plain = fresh();
        simulate(&scheds, &mut plain).unwrap();
        assert_eq!(plain[1].output[0], v(0, 0));
        let mut b = fresh();
        simulate_strict(&scheds, &mut b, mode).unwrap();
        assert_ne!(b[1].output[0], plain[1].output[0], "{mode:?} missed");
        // The other mode does not take this freedom: it agrees.
        let other = match mode {
            Mode::EarlyLanding => Mode::LateRead,
            Mode::LateRead => Mode::EarlyLanding,
        };
        let mut b = fresh();
        simulate_strict(&scheds, &mut b, other).unwrap();
        assert_eq!(b[1].output[0], plain[1].output[0], "{other:?}");
    }
}

/// The flat schedules this module builds on pass the strict run too.
#[test]
fn flat_ring_and_tree_pass_the_strict_run() {
    for n in [1, 2, 3, 5, 8] {
        for (c, ch) in [(0, 4), (7, 1), (37, 4), (1000, 64)] {
            let what = format!("ring n={n} c={c} ch={ch}");
            check_all_reduce(n, c, &what, |r| crate::schedule::all_reduce(n, r, c, ch));
            let what = format!("tree n={n} c={c} ch={ch}");
            check_all_reduce(n, c, &what, |r| {
                crate::schedule::all_reduce_tree(n, r, c, ch)
            });
        }
    }
}

#[test]
fn invalid_hosts_give_none() {
    let unequal = vec![vec![0, 1], vec![2]];
    let dup = vec![vec![0, 1], vec![1, 2]];
    let gap = vec![vec![0, 1], vec![2, 4]];
    let empty: Vec<Vec<usize>> = vec![vec![], vec![]];
    let none: Vec<Vec<usize>> = vec![];
    for ranks in [&unequal, &dup, &gap, &empty, &none] {
        let hs = Hosts { ranks };
        assert_eq!(hs.shape(), None, "{ranks:?}");
        for r in 0..4 {
            assert!(all_reduce_hier(hs, r, 10, 4).is_none(), "{ranks:?}");
            assert!(all_reduce_tree_hier(hs, r, 10, 4).is_none());
            assert!(reduce_scatter_hier(hs, r, 10, 4).is_none());
            assert!(all_gather_hier(hs, r, 10, 4).is_none());
            assert!(broadcast_hier(hs, r, 0, 10, 4).is_none());
            assert!(all_reduce_hier_traffic(hs, r, 10).is_none());
        }
    }
    let ok = vec![vec![0, 1], vec![2, 3]];
    let hs = Hosts { ranks: &ok };
    assert_eq!(hs.shape(), Some((2, 2)));
    assert_eq!(hs.locate(2), Some((1, 0)));
    // A rank or root outside the cluster.
    assert!(all_reduce_hier(hs, 4, 10, 4).is_none());
    assert!(broadcast_hier(hs, 0, 4, 10, 4).is_none());
    assert!(broadcast_hier_traffic(hs, 0, 4, 10).is_none());
}

/// Elements `sched` sends to ranks on its own host and on others.
fn counted(hosts: &[Vec<usize>], r: usize, sched: &Schedule) -> Traffic {
    let host = |q: usize| hosts.iter().position(|v| v.contains(&q)).unwrap();
    let mut t = Traffic::default();
    for s in &sched.steps {
        if let Some(to) = s.send_peer() {
            match host(to) == host(r) {
                true => t.intra += s.count(),
                false => t.inter += s.count(),
            }
        }
    }
    t
}

#[test]
fn traffic_helpers_match_the_schedules() {
    for (nh, nl, name, hosts) in shapes() {
        let n = nh * nl;
        let hs = Hosts { ranks: &hosts };
        for c in [0, 1, 7, 10, 1000, 1001] {
            for r in 0..n {
                let what = format!("{nh}x{nl} {name} c={c} rank {r}");
                let ch = 64;
                let got = |s: Option<Schedule>| counted(&hosts, r, &s.unwrap());
                assert_eq!(
                    all_reduce_hier_traffic(hs, r, c),
                    Some(got(all_reduce_hier(hs, r, c, ch))),
                    "all_reduce_hier {what}"
                );
                assert_eq!(
                    all_reduce_tree_hier_traffic(hs, r, c),
                    Some(got(all_reduce_tree_hier(hs, r, c, ch))),
                    "all_reduce_tree_hier {what}"
                );
                assert_eq!(
                    reduce_scatter_hier_traffic(hs, r, c),
                    Some(got(reduce_scatter_hier(hs, r, c, ch))),
                    "reduce_scatter_hier {what}"
                );
                assert_eq!(
                    all_gather_hier_traffic(hs, r, c),
                    Some(got(all_gather_hier(hs, r, c, ch))),
                    "all_gather_hier {what}"
                );
                for root in [0, n / 2, n - 1] {
                    assert_eq!(
                        broadcast_hier_traffic(hs, r, root, c),
                        Some(got(broadcast_hier(hs, r, root, c, ch))),
                        "broadcast_hier root={root} {what}"
                    );
                }
            }
        }
    }
}

/// What crosses hosts, summed over a cluster of contiguous hosts: each
/// collective moves the least a host must send (and the flat ring, whose
/// order visits hosts in turn, sends the rest through one rank per host).
#[test]
fn hosts_send_each_other_the_least_data() {
    let (nh, nl, c) = (3, 4, 1200);
    let hosts = &layouts(nh, nl)[0].1;
    let hs = Hosts { ranks: hosts };
    let n = nh * nl;
    let sum = |f: &dyn Fn(usize) -> Traffic| -> usize { (0..n).map(|r| f(r).inter).sum() };
    // Reduce-scatter: each host sends one partial segment per foreign rank.
    let rs = sum(&|r| reduce_scatter_hier_traffic(hs, r, c).unwrap());
    assert_eq!(rs, nh * (n - nl) * c);
    // All-gather: each host receives every foreign block once.
    let ag = sum(&|r| all_gather_hier_traffic(hs, r, c).unwrap());
    assert_eq!(ag, nh * (n - nl) * c);
    // Broadcast: every host but the root's receives the data once.
    let bc = sum(&|r| broadcast_hier_traffic(hs, r, 5, c).unwrap());
    assert_eq!(bc, (nh - 1) * c);
    // All-reduce: 2·(H-1)/H of the data per host, split over its ranks.
    let ar = sum(&|r| all_reduce_hier_traffic(hs, r, c).unwrap());
    assert_eq!(ar, nh * 2 * (nh - 1) * c / nh);
}

/// Runs `scheds` on real engines over the in-memory transport. `bufs[r]` is
/// `(input, output)`; `alias` says how an in-place call lays them out, in
/// which case the single buffer is `bufs[r].1` (all-reduce, broadcast,
/// all-gather) or `bufs[r].0` (reduce-scatter).
#[allow(clippy::too_many_arguments)]
fn drive<T: bytemuck::Pod>(
    scheds: &[Schedule],
    dtype: DataType,
    op: RedOp,
    bufs: &mut [(Vec<T>, Vec<T>)],
    in_len: usize,
    out_len: usize,
    alias: impl Fn(usize) -> Alias,
    what: &str,
) {
    let n = scheds.len();
    let es = dtype.size();
    let mut engines = engine_mesh(&MemNet::new(), n, 64);
    let regions = bufs
        .iter_mut()
        .enumerate()
        .map(|(r, (i, o))| match alias(r) {
            Alias::None => (
                Region::read_only(i.as_ptr().cast(), in_len * es),
                Region::new(o.as_mut_ptr().cast(), out_len * es),
            ),
            Alias::Same => {
                let out = Region::new(o.as_mut_ptr().cast(), out_len * es);
                (out, out)
            }
            Alias::OutInIn(at) => {
                let p: *mut u8 = i.as_mut_ptr().cast();
                (
                    Region::new(p, in_len * es),
                    Region::new(p.wrapping_add(at * es), out_len * es),
                )
            }
            Alias::InInOut(at) => {
                let p: *mut u8 = o.as_mut_ptr().cast();
                (
                    Region::new(p.wrapping_add(at * es), in_len * es),
                    Region::new(p, out_len * es),
                )
            }
        })
        .collect();
    drive_engines(&mut engines, scheds, dtype, op, regions, what);
}

fn value(r: usize, i: usize) -> i64 {
    ((r * 7919 + i * 31) % 1_000_003) as i64 * 1000 - 400_000_000
}

/// Engine shapes: fewer than the symbolic runs (the engine is slower).
fn engine_shapes() -> Vec<(usize, usize, &'static str, Vec<Vec<usize>>)> {
    shapes()
        .into_iter()
        .filter(|(nh, nl, name, _)| *nh <= 4 && *nl <= 3 && *name != "scrambled")
        .collect()
}

/// Integer sums and averages exact (the average divides once: a double or
/// missing division changes the truncated quotient), in place and not.
#[test]
fn engine_all_reduces_give_exact_sums_and_averages() {
    type Algo = fn(Hosts<'_>, usize, usize, usize) -> Option<Schedule>;
    let algos: [(&str, Algo); 2] = [("hier", all_reduce_hier), ("tree", all_reduce_tree_hier)];
    for (nh, nl, name, hosts) in engine_shapes() {
        let n = nh * nl;
        let hs = Hosts { ranks: &hosts };
        for (algo, f) in algos {
            for c in [0, 1, 7, 100] {
                let scheds: Vec<_> = (0..n).map(|r| f(hs, r, c, 8).unwrap()).collect();
                for op in [RedOp::Sum, RedOp::Avg] {
                    for in_place in [false, true] {
                        let what = format!("{algo} {nh}x{nl} {name} c={c} {op:?} {in_place}");
                        let mut bufs: Vec<_> = (0..n)
                            .map(|r| {
                                let input: Vec<i64> = (0..c).map(|i| value(r, i)).collect();
                                let out = if in_place { input.clone() } else { vec![0; c] };
                                (input, out)
                            })
                            .collect();
                        let alias = |_| if in_place { Alias::Same } else { Alias::None };
                        drive(&scheds, DataType::Int64, op, &mut bufs, c, c, alias, &what);
                        let want: Vec<i64> = (0..c)
                            .map(|i| {
                                let s: i64 = (0..n).map(|r| value(r, i)).sum();
                                if op == RedOp::Avg {
                                    s / n as i64
                                } else {
                                    s
                                }
                            })
                            .collect();
                        for r in 0..n {
                            assert_eq!(bufs[r].1, want, "{what} rank {r}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn engine_float_average_is_bit_identical_on_every_rank() {
    type Algo = fn(Hosts<'_>, usize, usize, usize) -> Option<Schedule>;
    let algos: [(&str, Algo); 2] = [("hier", all_reduce_hier), ("tree", all_reduce_tree_hier)];
    for (nh, nl, name, hosts) in engine_shapes() {
        let n = nh * nl;
        let hs = Hosts { ranks: &hosts };
        for (algo, f) in algos {
            let c = 101;
            let scheds: Vec<_> = (0..n).map(|r| f(hs, r, c, 4).unwrap()).collect();
            let fv = |r: usize, i: usize| (r as f32 + 1.0) * 0.1 + i as f32 * 0.37;
            let mut bufs: Vec<_> = (0..n)
                .map(|r| {
                    (
                        (0..c).map(|i| fv(r, i)).collect::<Vec<f32>>(),
                        vec![0f32; c],
                    )
                })
                .collect();
            let what = format!("{algo} {nh}x{nl} {name}");
            let alias = |_| Alias::None;
            drive(
                &scheds,
                DataType::Float32,
                RedOp::Avg,
                &mut bufs,
                c,
                c,
                alias,
                &what,
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (i, g) in bufs[0].1.iter().enumerate() {
                let want = (0..n).map(|r| fv(r, i)).sum::<f32>() / n as f32;
                assert!(
                    (g - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{what} element {i}: {g} vs {want}"
                );
            }
            for r in 1..n {
                assert_eq!(bits(&bufs[r].1), bits(&bufs[0].1), "{what} rank {r}");
            }
        }
    }
}

#[test]
fn engine_reduce_scatter_all_gather_and_broadcast_are_exact() {
    for (nh, nl, name, hosts) in engine_shapes() {
        let n = nh * nl;
        let hs = Hosts { ranks: &hosts };
        for c in [0, 1, 7, 50] {
            for in_place in [false, true] {
                let what = format!("{nh}x{nl} {name} c={c} in_place={in_place}");
                // Reduce-scatter (sum and average).
                let scheds: Vec<_> = (0..n)
                    .map(|r| reduce_scatter_hier(hs, r, c, 8).unwrap())
                    .collect();
                for op in [RedOp::Sum, RedOp::Avg] {
                    let mut bufs: Vec<_> = (0..n)
                        .map(|r| ((0..n * c).map(|i| value(r, i)).collect(), vec![0i64; c]))
                        .collect();
                    let alias = |r| match in_place {
                        true => Alias::OutInIn(r * c),
                        false => Alias::None,
                    };
                    let w = format!("reduce_scatter {what} {op:?}");
                    drive(&scheds, DataType::Int64, op, &mut bufs, n * c, c, alias, &w);
                    for r in 0..n {
                        let got = match in_place {
                            true => &bufs[r].0[r * c..(r + 1) * c],
                            false => &bufs[r].1[..],
                        };
                        let want: Vec<i64> = (0..c)
                            .map(|i| {
                                let s: i64 = (0..n).map(|q| value(q, r * c + i)).sum();
                                if op == RedOp::Avg {
                                    s / n as i64
                                } else {
                                    s
                                }
                            })
                            .collect();
                        assert_eq!(got, &want[..], "{w} rank {r}");
                    }
                }
                // All-gather.
                let scheds: Vec<_> = (0..n)
                    .map(|r| all_gather_hier(hs, r, c, 8).unwrap())
                    .collect();
                let mut bufs: Vec<_> = (0..n)
                    .map(|r| {
                        let input: Vec<i64> = (0..c).map(|i| value(r, i)).collect();
                        let mut out = vec![0i64; n * c];
                        if in_place {
                            out[r * c..(r + 1) * c].copy_from_slice(&input);
                        }
                        (input, out)
                    })
                    .collect();
                let alias = |r| match in_place {
                    true => Alias::InInOut(r * c),
                    false => Alias::None,
                };
                let w = format!("all_gather {what}");
                let sum = RedOp::Sum;
                drive(
                    &scheds,
                    DataType::Int64,
                    sum,
                    &mut bufs,
                    c,
                    n * c,
                    alias,
                    &w,
                );
                let want: Vec<i64> = (0..n * c).map(|i| value(i / c.max(1), i % c)).collect();
                for r in 0..n {
                    assert_eq!(bufs[r].1, want, "{w} rank {r}");
                }
                // Broadcast from a few roots.
                for root in [0, n / 2, n - 1] {
                    let scheds: Vec<_> = (0..n)
                        .map(|r| broadcast_hier(hs, r, root, c, 8).unwrap())
                        .collect();
                    let mut bufs: Vec<_> = (0..n)
                        .map(|r| {
                            let input: Vec<i64> = (0..c).map(|i| value(r, i)).collect();
                            let out = if in_place { input.clone() } else { vec![0; c] };
                            (input, out)
                        })
                        .collect();
                    let alias = |_| if in_place { Alias::Same } else { Alias::None };
                    let w = format!("broadcast root={root} {what}");
                    drive(&scheds, DataType::Int64, sum, &mut bufs, c, c, alias, &w);
                    let want: Vec<i64> = (0..c).map(|i| value(root, i)).collect();
                    for r in 0..n {
                        assert_eq!(bufs[r].1, want, "{w} rank {r}");
                    }
                }
            }
        }
    }
}
