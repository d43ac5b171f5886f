//! Grouped send/recv: post sends and receives to several peers at once
//! without deadlock (NCCL's `ncclGroupStart` / `ncclGroupEnd` around
//! `ncclSend` / `ncclRecv`).

use super::Communicator;
use crate::datatype::{DataType, Element};
use crate::engine::{CallBufs, OpLabel, Region};
use crate::error::{Error, Result};
use crate::schedule::{p2p_group, P2pOp, Schedule};
use std::marker::PhantomData;

/// A set of sends and receives that run together. The buffers stay
/// borrowed until the group runs, so they cannot be touched meanwhile.
///
/// ```no_run
/// # fn f(comm: &mut nccl_rs::Communicator) -> nccl_rs::Result<()> {
/// let (a, mut b) = (vec![1.0f32; 8], vec![0.0f32; 8]);
/// let n = comm.size();
/// let mut g = nccl_rs::P2pGroup::new();
/// g.send(&a, (comm.rank() + 1) % n);
/// g.recv(&mut b, (comm.rank() + n - 1) % n);
/// comm.run_group(g)?;
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct P2pGroup<'a> {
    pub(super) ops: Vec<P2pOp>,
    pub(super) bufs: Vec<Region>,
    /// The element type of each typed op (for the profiler).
    pub(super) dtypes: Vec<DataType>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> P2pGroup<'a> {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(&mut self, buf: &'a [T], peer: usize) -> &mut Self {
        let r = Region::read_only(buf.as_ptr().cast(), std::mem::size_of_val(buf));
        self.ops.push(P2pOp::Send {
            peer,
            buf: self.bufs.len(),
            count: r.len,
        });
        self.bufs.push(r);
        self.dtypes.push(T::DTYPE);
        self
    }

    /// Adds a receive into `buf` from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &'a mut [T], peer: usize) -> &mut Self {
        let r = Region::new(buf.as_mut_ptr().cast(), std::mem::size_of_val(buf));
        self.ops.push(P2pOp::Recv {
            peer,
            buf: self.bufs.len(),
            count: r.len,
        });
        self.bufs.push(r);
        self.dtypes.push(T::DTYPE);
        self
    }

    /// Whether the group has no operations.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A checked group: its schedule, label, regions, operations and their
/// element types.
pub(super) type GroupCall = (Schedule, OpLabel, CallBufs, (Vec<P2pOp>, Vec<DataType>));

impl Communicator {
    /// Runs a group of sends and receives; returns when all completed.
    pub fn run_group(&mut self, group: P2pGroup<'_>) -> Result<()> {
        let (sched, what, bufs, (ops, dtypes)) = self.group_call(group)?;
        self.idle_core()?.group(&sched, what, bufs, (&ops, &dtypes))
    }

    /// Checks a group and turns it into its schedule and regions, with its
    /// operations and their element types (for the profiler).
    pub(super) fn group_call(&self, group: P2pGroup<'_>) -> Result<GroupCall> {
        for op in &group.ops {
            let (P2pOp::Send { peer, .. } | P2pOp::Recv { peer, .. }) = *op;
            if peer >= self.nranks {
                return Err(Error::invalid(format!(
                    "send/recv: peer {peer} is not a rank of {}",
                    self.nranks
                )));
            }
        }
        let sched = p2p_group(self.rank, &group.ops)
            .map_err(|e| Error::invalid(format!("send/recv: {e}")))?;
        let bufs = CallBufs {
            input: Region::empty(),
            output: Region::empty(),
            group: group.bufs,
        };
        let what = OpLabel::Group {
            ops: group.ops.len(),
        };
        Ok((sched, what, bufs, (group.ops, group.dtypes)))
    }

    /// Sends `buf` to `peer` (matched by `peer`'s `recv`).
    pub fn send<T: Element>(&mut self, buf: &[T], peer: usize) -> Result<()> {
        let mut g = P2pGroup::new();
        g.send(buf, peer);
        self.run_group(g)
    }

    /// Receives into `buf` from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize) -> Result<()> {
        let mut g = P2pGroup::new();
        g.recv(buf, peer);
        self.run_group(g)
    }
}
