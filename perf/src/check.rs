//! Per-collective data layout for the check: which part of which buffer is
//! each rank's input, and what its output must be.

use std::ops::Range;

use nccl_rs::RedOp;

use crate::coll::{Collective, Counts};
use crate::data::{fill, poison, reduce_at, TestElem, ValueGen};

/// Where one rank stands in one measurement.
#[derive(Clone, Copy, Debug)]
pub struct Place {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// Root of broadcast and reduce.
    pub root: usize,
    /// Whether the operation runs in place (in the receive buffer).
    pub in_place: bool,
}

/// The value generator used by `coll` with `op` in type `T`.
pub fn generator<T: TestElem>(coll: Collective, op: RedOp, nranks: usize) -> ValueGen {
    if coll.has_op() {
        ValueGen::reduction::<T>(op, nranks)
    } else {
        ValueGen::movement::<T>()
    }
}

/// Writes this rank's input (into `send`, or into `recv` when in place),
/// poisons the rest of the output, and computes the expected output into
/// `expected`. Returns the range of `recv` to compare with `expected`, or
/// `None` when this rank has no output to check (reduce off the root,
/// sendrecv in place).
#[allow(clippy::too_many_arguments)]
pub fn prepare<T: TestElem>(
    coll: Collective,
    op: RedOp,
    gen: &ValueGen,
    p: Place,
    c: &Counts,
    send: &mut [T],
    recv: &mut [T],
    expected: &mut [T],
) -> Option<Range<usize>> {
    let (rank, n) = (p.rank, p.nranks);
    poison(&mut recv[..c.total()]);
    let input_base = if matches!(coll, Collective::AllGather | Collective::Gather) {
        rank * c.send
    } else {
        0
    };
    let input = if p.in_place {
        let at = c.send_inplace_offset * rank;
        &mut recv[at..at + c.send]
    } else {
        &mut send[..c.send]
    };
    fill(input, gen, rank, input_base);

    let out_at = if p.in_place {
        c.recv_inplace_offset * rank
    } else {
        0
    };
    let exp = &mut expected[..c.recv];
    match coll {
        Collective::AllReduce => {
            for (k, e) in exp.iter_mut().enumerate() {
                *e = reduce_at(gen, op, n, k);
            }
        }
        Collective::Reduce => {
            if rank != p.root {
                return None;
            }
            for (k, e) in exp.iter_mut().enumerate() {
                *e = reduce_at(gen, op, n, k);
            }
        }
        Collective::ReduceScatter => {
            let base = rank * c.recv;
            for (k, e) in exp.iter_mut().enumerate() {
                *e = reduce_at(gen, op, n, base + k);
            }
        }
        Collective::Broadcast => fill(exp, gen, p.root, 0),
        Collective::AllGather => {
            if c.send > 0 {
                for (j, block) in exp.chunks_mut(c.send).enumerate() {
                    fill(block, gen, j, j * c.send);
                }
            }
        }
        Collective::AllToAll => {
            if c.param > 0 {
                for (src, block) in exp.chunks_mut(c.param).enumerate() {
                    fill(block, gen, src, rank * c.param);
                }
            }
        }
        Collective::SendRecv => {
            if p.in_place {
                return None;
            }
            fill(exp, gen, (rank + n - 1) % n, 0);
        }
        Collective::Gather => {
            if rank != p.root {
                return None;
            }
            if c.send > 0 {
                for (j, block) in exp.chunks_mut(c.send).enumerate() {
                    fill(block, gen, j, j * c.send);
                }
            }
        }
        Collective::Scatter => fill(exp, gen, p.root, rank * c.recv),
    }
    Some(out_at..out_at + c.recv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::count_wrong;

    /// Simulates `coll` on the host from the prepared inputs of all ranks
    /// and checks that every rank's output matches its expectation.
    fn simulate(coll: Collective, op: RedOp, n: usize, count: usize, in_place: bool) {
        let c = coll.counts(count, n);
        let gen = generator::<f32>(coll, op, n);
        let root = n - 1;
        let mut sends = vec![vec![0f32; count]; n];
        let mut recvs = vec![vec![0f32; count]; n];
        let mut exps = vec![vec![0f32; count]; n];
        let mut ranges = Vec::new();
        for r in 0..n {
            let p = Place {
                rank: r,
                nranks: n,
                root,
                in_place,
            };
            ranges.push(prepare(
                coll,
                op,
                &gen,
                p,
                &c,
                &mut sends[r],
                &mut recvs[r],
                &mut exps[r],
            ));
        }
        let input = |r: usize, recvs: &Vec<Vec<f32>>, sends: &Vec<Vec<f32>>| -> Vec<f32> {
            if in_place {
                let at = c.send_inplace_offset * r;
                recvs[r][at..at + c.send].to_vec()
            } else {
                sends[r][..c.send].to_vec()
            }
        };
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, &recvs, &sends)).collect();
        let red = |vals: Vec<f32>| -> f32 {
            let s: f32 = vals.iter().sum();
            match op {
                RedOp::Sum => s,
                RedOp::Avg => s / n as f32,
                RedOp::Prod => vals.iter().product(),
                RedOp::Max => vals.iter().cloned().fold(f32::MIN, f32::max),
                RedOp::Min => vals.iter().cloned().fold(f32::MAX, f32::min),
            }
        };
        for r in 0..n {
            let out: Vec<f32> = match coll {
                Collective::AllReduce | Collective::Reduce => (0..c.recv)
                    .map(|k| red(inputs.iter().map(|i| i[k]).collect()))
                    .collect(),
                Collective::ReduceScatter => (0..c.recv)
                    .map(|k| red(inputs.iter().map(|i| i[r * c.recv + k]).collect()))
                    .collect(),
                Collective::Broadcast => inputs[root].clone(),
                Collective::AllGather => inputs.concat(),
                Collective::AllToAll => (0..n)
                    .flat_map(|s| inputs[s][r * c.param..(r + 1) * c.param].to_vec())
                    .collect(),
                Collective::SendRecv => inputs[(r + n - 1) % n].clone(),
                Collective::Gather => inputs.concat(),
                Collective::Scatter => inputs[root][r * c.recv..(r + 1) * c.recv].to_vec(),
            };
            if let Some(range) = &ranges[r] {
                let tol = crate::data::tolerance::<f32>(&gen, op, n);
                assert_eq!(
                    count_wrong(&out, &exps[r][..c.recv], tol),
                    0,
                    "{coll:?} {op:?} r={r}"
                );
                assert_eq!(range.len(), c.recv);
            }
        }
    }

    #[test]
    fn expectations_match_a_host_simulation() {
        for coll in [
            Collective::AllReduce,
            Collective::Reduce,
            Collective::ReduceScatter,
            Collective::Broadcast,
            Collective::AllGather,
            Collective::AllToAll,
            Collective::SendRecv,
            Collective::Gather,
            Collective::Scatter,
        ] {
            for n in [1, 2, 3, 4] {
                for in_place in [false, true] {
                    for op in RedOp::ALL {
                        simulate(coll, op, n, 37, in_place);
                    }
                }
            }
        }
    }

    #[test]
    fn in_place_all_gather_puts_input_at_rank_block() {
        let c = Collective::AllGather.counts(12, 3);
        let gen = ValueGen::movement::<i32>();
        let (mut s, mut r, mut e) = (vec![0i32; 12], vec![0i32; 12], vec![0i32; 12]);
        let p = Place {
            rank: 1,
            nranks: 3,
            root: 0,
            in_place: true,
        };
        let range = prepare(
            Collective::AllGather,
            RedOp::Sum,
            &gen,
            p,
            &c,
            &mut s,
            &mut r,
            &mut e,
        );
        assert_eq!(range, Some(0..12));
        assert_eq!(&r[4..8], &e[4..8]);
        assert_eq!(r[0], -1); // poisoned
    }
}
