//! The collectives under test: element counts per size and bandwidth
//! formulas, exactly as nccl-tests computes them.

/// One perf tool's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// `all_reduce_perf`.
    AllReduce,
    /// `all_gather_perf`.
    AllGather,
    /// `reduce_scatter_perf`.
    ReduceScatter,
    /// `broadcast_perf`.
    Broadcast,
    /// `reduce_perf`.
    Reduce,
    /// `alltoall_perf`.
    AllToAll,
    /// `sendrecv_perf`: each rank sends to `rank+1` and receives from `rank-1`.
    SendRecv,
    /// `gather_perf`: every rank's block into the root's output.
    Gather,
    /// `scatter_perf`: block `r` of the root's input to rank `r`.
    Scatter,
}

/// Element counts of one measurement (nccl-tests' `getCollByteCount`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Elements each rank sends (its input).
    pub send: usize,
    /// Elements each rank receives (its output).
    pub recv: usize,
    /// The count argument of the call, printed in the "count" column.
    pub param: usize,
    /// In place, the input starts at `send_inplace_offset * rank` in the buffer.
    pub send_inplace_offset: usize,
    /// In place, the output starts at `recv_inplace_offset * rank` in the buffer.
    pub recv_inplace_offset: usize,
}

impl Counts {
    /// Elements of the larger of the two buffers.
    pub fn total(&self) -> usize {
        self.send.max(self.recv)
    }

    /// The "size" column: bytes of the larger of input and output.
    pub fn size_bytes(&self, type_size: usize) -> usize {
        self.total() * type_size
    }
}

impl Collective {
    /// The tool's name as nccl-tests names the binary.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce_perf",
            Collective::AllGather => "all_gather_perf",
            Collective::ReduceScatter => "reduce_scatter_perf",
            Collective::Broadcast => "broadcast_perf",
            Collective::Reduce => "reduce_perf",
            Collective::AllToAll => "alltoall_perf",
            Collective::SendRecv => "sendrecv_perf",
            Collective::Gather => "gather_perf",
            Collective::Scatter => "scatter_perf",
        }
    }

    /// The NCCL-shaped call that runs it (`None` for sendrecv, a group).
    pub fn raw(self) -> Option<nccl_rs::comm::raw::RawColl> {
        use nccl_rs::comm::raw::RawColl;
        Some(match self {
            Collective::AllReduce => RawColl::AllReduce,
            Collective::AllGather => RawColl::AllGather,
            Collective::ReduceScatter => RawColl::ReduceScatter,
            Collective::Broadcast => RawColl::Broadcast,
            Collective::Reduce => RawColl::Reduce,
            Collective::AllToAll => RawColl::AllToAll,
            Collective::Gather => RawColl::Gather,
            Collective::Scatter => RawColl::Scatter,
            Collective::SendRecv => return None,
        })
    }

    /// Whether the operation takes a reduction operator (else "none" is printed).
    pub fn has_op(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }

    /// Whether the operation has a root (else -1 is printed).
    pub fn has_root(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }

    /// Counts for a size of `count` elements (size / type size) at `nranks`.
    pub fn counts(self, count: usize, nranks: usize) -> Counts {
        let per_rank = count / nranks;
        let (send, recv, param, so, ro) = match self {
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::SendRecv => (count, count, count, 0, 0),
            Collective::AllGather | Collective::Gather => {
                (per_rank, per_rank * nranks, per_rank, per_rank, 0)
            }
            Collective::ReduceScatter | Collective::Scatter => {
                (per_rank * nranks, per_rank, per_rank, 0, per_rank)
            }
            Collective::AllToAll => (per_rank * nranks, per_rank * nranks, per_rank, 0, 0),
        };
        Counts {
            send,
            recv,
            param,
            send_inplace_offset: so,
            recv_inplace_offset: ro,
        }
    }

    /// Bus bandwidth over algorithm bandwidth.
    pub fn bus_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather
            | Collective::ReduceScatter
            | Collective::AllToAll
            | Collective::Gather
            | Collective::Scatter => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        }
    }

    /// `(algbw, busbw)` in GB/s (10^9 bytes) for `param` elements of
    /// `type_size` bytes taking `secs` per operation.
    pub fn bandwidth(self, param: usize, type_size: usize, secs: f64, nranks: usize) -> (f64, f64) {
        let per_call = match self {
            Collective::AllGather
            | Collective::ReduceScatter
            | Collective::AllToAll
            | Collective::Gather
            | Collective::Scatter => param * type_size * nranks,
            _ => param * type_size,
        };
        let alg = per_call as f64 / 1.0e9 / secs;
        (alg, alg * self.bus_factor(nranks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_collective() {
        // 1000 floats = 4000 B at 3 ranks.
        let c = Collective::AllReduce.counts(1000, 3);
        assert_eq!(
            (c.send, c.recv, c.param, c.size_bytes(4)),
            (1000, 1000, 1000, 4000)
        );
        let c = Collective::AllGather.counts(1000, 3);
        assert_eq!((c.send, c.recv, c.param), (333, 999, 333));
        assert_eq!(
            (
                c.send_inplace_offset,
                c.recv_inplace_offset,
                c.size_bytes(4)
            ),
            (333, 0, 3996)
        );
        let c = Collective::ReduceScatter.counts(1000, 3);
        assert_eq!((c.send, c.recv, c.param), (999, 333, 333));
        assert_eq!((c.send_inplace_offset, c.recv_inplace_offset), (0, 333));
        let c = Collective::AllToAll.counts(1000, 3);
        assert_eq!((c.send, c.recv, c.param, c.total()), (999, 999, 333, 999));
        for coll in [
            Collective::Broadcast,
            Collective::Reduce,
            Collective::SendRecv,
        ] {
            let c = coll.counts(7, 3);
            assert_eq!((c.send, c.recv, c.param), (7, 7, 7));
        }
        // Gather and scatter count as all-gather and reduce-scatter do
        // (nccl-tests: the size is the root's whole buffer).
        let c = Collective::Gather.counts(1000, 3);
        assert_eq!(
            (c.send, c.recv, c.param, c.send_inplace_offset),
            (333, 999, 333, 333)
        );
        let c = Collective::Scatter.counts(1000, 3);
        assert_eq!(
            (c.send, c.recv, c.param, c.recv_inplace_offset),
            (999, 333, 333, 333)
        );
        assert!(Collective::Gather.has_root() && Collective::Scatter.has_root());
        assert_eq!(Collective::Gather.bus_factor(4), 0.75);
        assert_eq!(Collective::Scatter.bandwidth(125_000_000, 4, 0.5, 4).0, 4.0);
        // Too small to split: nothing per rank.
        let c = Collective::AllGather.counts(2, 3);
        assert_eq!((c.send, c.recv, c.param, c.total()), (0, 0, 0, 0));
    }

    #[test]
    fn bus_factors() {
        assert_eq!(Collective::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Collective::AllReduce.bus_factor(1), 0.0);
        assert_eq!(Collective::AllGather.bus_factor(4), 0.75);
        assert_eq!(Collective::ReduceScatter.bus_factor(2), 0.5);
        assert_eq!(Collective::AllToAll.bus_factor(8), 0.875);
        assert_eq!(Collective::Broadcast.bus_factor(8), 1.0);
        assert_eq!(Collective::Reduce.bus_factor(8), 1.0);
        assert_eq!(Collective::SendRecv.bus_factor(8), 1.0);
    }

    #[test]
    fn bandwidths() {
        // 1 GB in 1 s.
        let (a, b) = Collective::AllReduce.bandwidth(250_000_000, 4, 1.0, 2);
        assert_eq!((a, b), (1.0, 1.0));
        // All-gather counts per rank: algbw is the total output over time.
        let (a, b) = Collective::AllGather.bandwidth(125_000_000, 4, 0.5, 4);
        assert_eq!((a, b), (4.0, 3.0));
        let (a, _) = Collective::SendRecv.bandwidth(1_000_000, 1, 0.001, 4);
        assert!((a - 1.0).abs() < 1e-12);
    }
}
