//! Untyped entry points on raw pointers, for the C ABI. Everything typed in
//! `collectives.rs` has a safe equivalent; these exist because C callers
//! hand us pointers, not slices.

use super::{Communicator, P2pGroup};
use crate::datatype::{DataType, RedOp};
use crate::engine::{CallBufs, Region};
use crate::error::{Error, Result};
use crate::plan::Coll;
use crate::schedule::P2pOp;

/// Which collective a raw call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawColl {
    /// `ncclAllReduce`: `count` elements in and out.
    AllReduce,
    /// `ncclBroadcast`: `count` elements from `root`.
    Broadcast,
    /// `ncclReduce`: `count` elements to `root`.
    Reduce,
    /// `ncclAllGather`: `count` elements in, `count * nranks` out.
    AllGather,
    /// `ncclReduceScatter`: `count * nranks` in, `count` out.
    ReduceScatter,
    /// `ncclAlltoAll`: `count` elements to and from each rank.
    AllToAll,
    /// `ncclGather`: `count` in, `count * nranks` out at `root`.
    Gather,
    /// `ncclScatter`: `count * nranks` in at `root`, `count` out.
    Scatter,
}

/// One raw collective call, with NCCL's argument meanings.
#[derive(Clone, Copy, Debug)]
pub struct RawArgs {
    /// The collective.
    pub coll: RawColl,
    /// `sendbuff`.
    pub send: *const u8,
    /// `recvbuff`.
    pub recv: *mut u8,
    /// `count` as NCCL defines it for this collective.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (ignored by data-movement collectives).
    pub op: RedOp,
    /// Root rank (rooted collectives).
    pub root: usize,
}

/// One raw send or receive of a group.
#[derive(Clone, Copy, Debug)]
pub struct RawP2p {
    /// `true` for a send.
    pub is_send: bool,
    /// Peer rank.
    pub peer: usize,
    /// Buffer.
    pub ptr: *mut u8,
    /// Bytes.
    pub bytes: usize,
}

impl Communicator {
    /// Bytes of the send and receive buffers NCCL defines for `a` on this
    /// rank (`(send, recv)`; 0 where the buffer is not used).
    pub fn raw_sizes(&self, a: &RawArgs) -> (usize, usize) {
        let (n, es, c) = (self.nranks, a.dtype.size(), a.count);
        let root = self.rank == a.root;
        let b = c * es;
        match a.coll {
            RawColl::AllReduce => (b, b),
            RawColl::Broadcast => (if root { b } else { 0 }, b),
            RawColl::Reduce => (b, if root { b } else { 0 }),
            RawColl::AllGather => (b, n * b),
            RawColl::ReduceScatter => (n * b, b),
            RawColl::AllToAll => (n * b, n * b),
            RawColl::Gather => (b, if root { n * b } else { 0 }),
            RawColl::Scatter => (if root { n * b } else { 0 }, b),
        }
    }

    /// Runs one collective on raw pointers. In-place calls are recognised by
    /// NCCL's rules (`send == recv`, or the send slice sitting at this rank's
    /// place in the receive buffer for all-gather and the reverse for
    /// reduce-scatter).
    ///
    /// # Safety
    /// For this rank, `send` must be valid for reads of `raw_sizes().0`
    /// bytes and `recv` for reads and writes of `raw_sizes().1` bytes, for
    /// the whole call, with no other access meanwhile. Both must be aligned
    /// for `dtype`. Overlap other than NCCL's in-place layouts is not
    /// allowed.
    pub unsafe fn collective_raw(&mut self, a: &RawArgs) -> Result<()> {
        let (coll, bufs) = self.raw_call(a)?;
        self.collective(coll, a.dtype, a.op, bufs)
    }

    /// Checks a raw call and turns it into the engine's collective and
    /// regions (nothing is read or written).
    pub(super) fn raw_call(&self, a: &RawArgs) -> Result<(Coll, CallBufs)> {
        if a.root >= self.nranks
            && matches!(
                a.coll,
                RawColl::Broadcast | RawColl::Reduce | RawColl::Gather | RawColl::Scatter
            )
        {
            return Err(Error::invalid(format!(
                "root {} is not a rank of {}",
                a.root, self.nranks
            )));
        }
        let (sb, rb) = self.raw_sizes(a);
        for (what, p, len) in [
            ("sendbuff", a.send, sb),
            ("recvbuff", a.recv as *const u8, rb),
        ] {
            if len > 0 && p.is_null() {
                return Err(Error::invalid(format!(
                    "{what} is NULL but {len} bytes are needed"
                )));
            }
            if len > 0 && (p as usize) % a.dtype.size() != 0 {
                return Err(Error::invalid(format!(
                    "{what} {p:?} is not aligned for {}",
                    a.dtype
                )));
            }
        }
        let input = Region::read_only(a.send, sb);
        let output = Region::new(a.recv, rb);
        let c = a.count;
        let coll = match a.coll {
            RawColl::AllReduce => Coll::AllReduce { count: c },
            RawColl::Broadcast => Coll::Broadcast {
                count: c,
                root: a.root,
            },
            RawColl::Reduce => Coll::Reduce {
                count: c,
                root: a.root,
            },
            RawColl::AllGather => Coll::AllGather { send_count: c },
            RawColl::ReduceScatter => Coll::ReduceScatter { recv_count: c },
            RawColl::Gather => Coll::Gather {
                count: c,
                root: a.root,
            },
            RawColl::Scatter => Coll::Scatter {
                count: c,
                root: a.root,
            },
            // In place, `Core` stages a copy of the input.
            RawColl::AllToAll => Coll::AllToAll { count: c },
        };
        Ok((
            coll,
            CallBufs {
                input,
                output,
                group: Vec::new(),
            },
        ))
    }

    /// Runs a group of raw sends and receives (`ncclGroupStart` … `ncclGroupEnd`).
    ///
    /// # Safety
    /// Every `ptr` must be valid for `bytes` (reads for sends, reads and
    /// writes for receives) for the whole call; receive buffers must not
    /// overlap each other or any send buffer.
    pub unsafe fn run_group_raw(&mut self, ops: &[RawP2p]) -> Result<()> {
        let g = raw_group(ops)?;
        self.run_group(g)
    }
}

/// The group of raw sends and receives `ops` (NULL buffers refused).
pub(super) fn raw_group(ops: &[RawP2p]) -> Result<P2pGroup<'static>> {
    let mut g = P2pGroup::new();
    for op in ops {
        if op.bytes > 0 && op.ptr.is_null() {
            return Err(Error::invalid(format!(
                "NULL buffer for {} bytes with peer {}",
                op.bytes, op.peer
            )));
        }
        let r = Region::new(op.ptr, op.bytes);
        let idx = g.bufs.len();
        g.ops.push(match op.is_send {
            true => P2pOp::Send {
                peer: op.peer,
                buf: idx,
                count: op.bytes,
            },
            false => P2pOp::Recv {
                peer: op.peer,
                buf: idx,
                count: op.bytes,
            },
        });
        g.bufs.push(r);
    }
    Ok(g)
}
