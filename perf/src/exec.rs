//! Issues one operation of a collective on the communicator.

use nccl_rs::{Communicator, Element, P2pGroup, RedOp, Result};

use crate::coll::{Collective, Counts};

/// Runs `coll` once on the first elements of `send` and `recv` (both at
/// least `c.total()` long). In place, only `recv` is used, with the input
/// and output where [`Counts`] puts them.
///
/// `sendrecv` cannot alias its send and receive buffers in this API; in
/// place it times the same exchange with the roles of the two buffers
/// swapped (nccl-tests does not check in-place sendrecv either).
#[allow(clippy::too_many_arguments)]
pub fn run_op<T: Element>(
    comm: &mut Communicator,
    coll: Collective,
    op: RedOp,
    root: usize,
    c: &Counts,
    in_place: bool,
    send: &mut [T],
    recv: &mut [T],
) -> Result<()> {
    let (s, r) = (c.send, c.recv);
    match (coll, in_place) {
        (Collective::AllReduce, false) => comm.all_reduce(&send[..s], &mut recv[..r], op),
        (Collective::AllReduce, true) => comm.all_reduce_in_place(&mut recv[..r], op),
        (Collective::AllGather, false) => comm.all_gather(&send[..s], &mut recv[..r]),
        (Collective::AllGather, true) => comm.all_gather_in_place(&mut recv[..r]),
        (Collective::ReduceScatter, false) => comm.reduce_scatter(&send[..s], &mut recv[..r], op),
        (Collective::ReduceScatter, true) => comm.reduce_scatter_in_place(&mut recv[..s], op),
        (Collective::Broadcast, false) => comm.broadcast(&send[..s], &mut recv[..r], root),
        (Collective::Broadcast, true) => comm.broadcast_in_place(&mut recv[..r], root),
        (Collective::Reduce, false) => comm.reduce(&send[..s], &mut recv[..r], op, root),
        (Collective::Reduce, true) => comm.reduce_in_place(&mut recv[..r], op, root),
        (Collective::AllToAll, false) => comm.all_to_all(&send[..s], &mut recv[..r]),
        (Collective::AllToAll, true) => comm.all_to_all_in_place(&mut recv[..r]),
        (Collective::SendRecv, swapped) => {
            let (rank, n) = (comm.rank(), comm.size());
            let (from, into) = if swapped {
                (&recv[..s], &mut send[..r])
            } else {
                (&send[..s], &mut recv[..r])
            };
            let mut g = P2pGroup::new();
            g.send(from, (rank + 1) % n);
            g.recv(into, (rank + n - 1) % n);
            comm.run_group(g)
        }
    }
}
