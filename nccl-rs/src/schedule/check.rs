//! Checks of schedules without any transport: per-link message matching and
//! a symbolic dataflow run that proves what every output element holds.
//!
//! Each element is modelled as `Val { ranks, index }`: the set of ranks whose
//! contribution it holds and the global index it belongs to. A reduction
//! asserts equal indices and disjoint rank sets, so a schedule that loses,
//! duplicates or misplaces a contribution fails the check.

use super::{Loc, Schedule, Step};
use std::collections::VecDeque;

/// The symbolic value of one element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Val {
    /// Bit `r` set: rank `r` contributed.
    pub ranks: u128,
    /// The global element index this value belongs to.
    pub index: u64,
}

/// The buffers of one rank in a symbolic run.
#[derive(Clone, Debug, Default)]
pub struct SymBufs {
    /// Input buffer.
    pub input: Vec<Option<Val>>,
    /// Output buffer.
    pub output: Vec<Option<Val>>,
    /// Scratch buffer.
    pub scratch: Vec<Option<Val>>,
}

fn buf(b: &mut SymBufs, loc: Loc) -> Result<(&mut Vec<Option<Val>>, usize), String> {
    match loc {
        Loc::In(o) => Ok((&mut b.input, o)),
        Loc::Out(o) => Ok((&mut b.output, o)),
        Loc::Scratch(o) => Ok((&mut b.scratch, o)),
        Loc::Group(..) => Err("group buffers are not modelled".into()),
    }
}

fn read(b: &mut SymBufs, loc: Loc, count: usize) -> Result<Vec<Val>, String> {
    let (v, o) = buf(b, loc)?;
    let s = v
        .get(o..o + count)
        .ok_or_else(|| format!("read {loc:?}+{count} out of bounds"))?;
    s.iter()
        .map(|x| x.ok_or_else(|| format!("read of unwritten element in {loc:?}")))
        .collect()
}

fn write(b: &mut SymBufs, loc: Loc, vals: &[Val]) -> Result<(), String> {
    let (v, o) = buf(b, loc)?;
    let s = v
        .get_mut(o..o + vals.len())
        .ok_or_else(|| format!("write {loc:?}+{} out of bounds", vals.len()))?;
    for (d, x) in s.iter_mut().zip(vals) {
        *d = Some(*x);
    }
    Ok(())
}

fn combine(a: &[Val], b: &[Val]) -> Result<Vec<Val>, String> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.index != y.index {
                Err(format!(
                    "reduced element {} with element {}",
                    x.index, y.index
                ))
            } else if x.ranks & y.ranks != 0 {
                Err(format!(
                    "element {} counts ranks {:#x} twice",
                    x.index,
                    x.ranks & y.ranks
                ))
            } else {
                Ok(Val {
                    ranks: x.ranks | y.ranks,
                    index: x.index,
                })
            }
        })
        .collect()
}

/// Runs every rank's schedule on symbolic buffers, with unbounded in-order
/// links, until all finish. Fails on a deadlock (no rank can move), a size
/// mismatch between a send and its receive, an out-of-bounds access, a read
/// of unwritten data, or a bad reduction.
pub fn simulate(scheds: &[Schedule], bufs: &mut [SymBufs]) -> Result<(), String> {
    let n = scheds.len();
    for (b, s) in bufs.iter_mut().zip(scheds) {
        b.scratch = vec![None; s.scratch];
    }
    let mut links: Vec<VecDeque<Vec<Val>>> = vec![VecDeque::new(); n * n];
    let mut pc = vec![0usize; n];
    loop {
        let mut moved = false;
        for r in 0..n {
            while let Some(step) = scheds[r].steps.get(pc[r]) {
                let incoming = match step.recv_peer() {
                    Some(from) => match links[from * n + r].pop_front() {
                        Some(m) if m.len() == step.count() => Some(m),
                        Some(m) => {
                            return Err(format!(
                                "rank {r} step {}: expected {} elements from {from}, got {}",
                                pc[r],
                                step.count(),
                                m.len()
                            ))
                        }
                        None => break,
                    },
                    None => None,
                };
                let out = exec(&mut bufs[r], step, incoming)?;
                if let (Some(to), Some(m)) = (step.send_peer(), out) {
                    links[r * n + to].push_back(m);
                }
                pc[r] += 1;
                moved = true;
            }
        }
        if (0..n).all(|r| pc[r] == scheds[r].steps.len()) {
            return match links.iter().position(|l| !l.is_empty()) {
                Some(i) => Err(format!(
                    "message from {} to {} never received",
                    i / n,
                    i % n
                )),
                None => Ok(()),
            };
        }
        if !moved {
            let stuck: Vec<_> = (0..n).filter(|&r| pc[r] < scheds[r].steps.len()).collect();
            return Err(format!(
                "deadlock: ranks {stuck:?} cannot progress (pcs {pc:?})"
            ));
        }
    }
}

/// Executes one step; returns the data it sends, if any.
fn exec(
    b: &mut SymBufs,
    step: &Step,
    incoming: Option<Vec<Val>>,
) -> Result<Option<Vec<Val>>, String> {
    let inc = || incoming.clone().ok_or("missing incoming data".to_string());
    Ok(match *step {
        Step::Send { src, count, .. } => Some(read(b, src, count)?),
        Step::Recv { dst, .. } => {
            write(b, dst, &inc()?)?;
            None
        }
        Step::RecvReduceCopySend {
            src,
            dst,
            count,
            to,
            ..
        } => {
            let v = combine(&read(b, src, count)?, &inc()?)?;
            write(b, dst, &v)?;
            to.map(|_| v)
        }
        Step::RecvCopySend { dst, .. } => {
            let v = inc()?;
            write(b, dst, &v)?;
            Some(v)
        }
        Step::Copy { src, dst, count } => {
            let v = read(b, src, count)?;
            write(b, dst, &v)?;
            None
        }
        Step::Reduce {
            src, dst, count, ..
        } => {
            let v = combine(&read(b, dst, count)?, &read(b, src, count)?)?;
            write(b, dst, &v)?;
            None
        }
    })
}

/// Checks only the per-link matching: for each ordered pair of ranks, the
/// sizes of the messages sent equal the sizes of the receives posted.
pub fn check_matching(scheds: &[Schedule]) -> Result<(), String> {
    let n = scheds.len();
    let mut sends = vec![Vec::new(); n * n];
    let mut recvs = vec![Vec::new(); n * n];
    for (r, s) in scheds.iter().enumerate() {
        for step in &s.steps {
            if let Some(to) = step.send_peer() {
                sends
                    .get_mut(r * n + to)
                    .ok_or("peer out of range")?
                    .push(step.count());
            }
            if let Some(from) = step.recv_peer() {
                recvs
                    .get_mut(from * n + r)
                    .ok_or("peer out of range")?
                    .push(step.count());
            }
        }
    }
    for i in 0..n * n {
        if sends[i] != recvs[i] {
            return Err(format!(
                "link {} -> {}: sends {:?} but receives {:?}",
                i / n,
                i % n,
                sends[i],
                recvs[i]
            ));
        }
    }
    Ok(())
}
