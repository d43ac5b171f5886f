//! Issues one operation of a collective on the communicator.

use nccl_rs::comm::raw::RawArgs;
use nccl_rs::{Communicator, Element, Error, P2pGroup, RedOp, Result};

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
        (Collective::Gather | Collective::Scatter, in_place) => {
            rooted_raw(comm, coll, root, c, in_place, send, recv)
        }
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

/// Gather and scatter through the raw (NCCL-shaped) call, whose in-place
/// form the slice API cannot express: the input (gather) or output
/// (scatter) is this rank's block of `recv`.
fn rooted_raw<T: Element>(
    comm: &mut Communicator,
    coll: Collective,
    root: usize,
    c: &Counts,
    in_place: bool,
    send: &mut [T],
    recv: &mut [T],
) -> Result<()> {
    let rank = comm.rank();
    let (s_at, r_at) = match in_place {
        true => (c.send_inplace_offset * rank, c.recv_inplace_offset * rank),
        false => (0, 0),
    };
    let buf_len = if in_place { recv.len() } else { send.len() };
    if s_at + c.send > buf_len || r_at + c.recv > recv.len() {
        return Err(Error::InvalidArgument(format!(
            "{}: buffers too short for {} / {} elements",
            coll.name(),
            c.send,
            c.recv
        )));
    }
    let recv_ptr = recv.as_mut_ptr();
    let send_ptr = match in_place {
        true => recv_ptr.cast_const(),
        false => send.as_ptr(),
    };
    let Some(raw) = coll.raw() else {
        return Err(Error::InvalidArgument(format!(
            "{} has no raw call",
            coll.name()
        )));
    };
    let args = RawArgs {
        coll: raw,
        send: send_ptr.wrapping_add(s_at).cast(),
        recv: recv_ptr.wrapping_add(r_at).cast(),
        count: c.param,
        dtype: T::DTYPE,
        op: RedOp::Sum,
        root,
    };
    // SAFETY: both pointers lie inside `send` / `recv`, borrowed for the
    // call, with `c.send` and `c.recv` elements from them (checked above);
    // in place they are parts of `recv` laid out as NCCL's in-place gather
    // and scatter expect, and nothing else touches them during the call.
    unsafe { comm.collective_raw(&args) }
}
