//! The typed collectives of [`Communicator`]. Each checks its arguments
//! (returning `InvalidArgument` with a message, never panicking), turns the
//! slices into raw regions and calls the one engine path.
//!
//! In-place rules follow NCCL: all-gather in place keeps this rank's input at
//! `buf[rank*c..(rank+1)*c]`; reduce-scatter in place leaves this rank's
//! result there.

use super::Communicator;
use crate::datatype::{DataType, Element, RedOp};
use crate::engine::{CallBufs, Region};
use crate::error::{Error, Result};
use crate::plan::Coll;

fn ro<T: Element>(s: &[T]) -> Region {
    Region::read_only(s.as_ptr().cast(), std::mem::size_of_val(s))
}

fn rw<T: Element>(s: &mut [T]) -> Region {
    Region::new(s.as_mut_ptr().cast(), std::mem::size_of_val(s))
}

fn bufs(input: Region, output: Region) -> CallBufs {
    CallBufs {
        input,
        output,
        group: Vec::new(),
    }
}

fn same_len(what: &str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(Error::invalid(format!(
            "{what}: send has {a} elements but recv has {b}"
        )));
    }
    Ok(())
}

impl Communicator {
    fn equal_parts(&self, what: &str, len: usize) -> Result<usize> {
        if len % self.nranks != 0 {
            return Err(Error::invalid(format!(
                "{what}: {len} elements do not split into {} equal parts",
                self.nranks
            )));
        }
        Ok(len / self.nranks)
    }

    /// `recv = send[0] ⊕ … ⊕ send[n-1]` on every rank.
    pub fn all_reduce<T: Element>(&mut self, send: &[T], recv: &mut [T], op: RedOp) -> Result<()> {
        same_len("all_reduce", send.len(), recv.len())?;
        self.collective(
            Coll::AllReduce { count: send.len() },
            T::DTYPE,
            op,
            bufs(ro(send), rw(recv)),
        )
    }

    /// In-place all-reduce.
    pub fn all_reduce_in_place<T: Element>(&mut self, buf: &mut [T], op: RedOp) -> Result<()> {
        let r = rw(buf);
        self.collective(
            Coll::AllReduce { count: buf.len() },
            T::DTYPE,
            op,
            bufs(r, r),
        )
    }

    /// Copies `root`'s `send` into every rank's `recv`. `send` is read on
    /// the root only and may be empty elsewhere.
    pub fn broadcast<T: Element>(&mut self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.check_root("broadcast", root)?;
        if self.rank == root {
            same_len("broadcast", send.len(), recv.len())?;
        }
        self.collective(
            Coll::Broadcast {
                count: recv.len(),
                root,
            },
            T::DTYPE,
            RedOp::Sum,
            bufs(ro(send), rw(recv)),
        )
    }

    /// In-place broadcast.
    pub fn broadcast_in_place<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        self.check_root("broadcast", root)?;
        let r = rw(buf);
        self.collective(
            Coll::Broadcast {
                count: buf.len(),
                root,
            },
            T::DTYPE,
            RedOp::Sum,
            bufs(r, r),
        )
    }

    /// Reduces every rank's `send` into `root`'s `recv`. `recv` is written
    /// on the root only and may be empty elsewhere.
    pub fn reduce<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        self.check_root("reduce", root)?;
        if self.rank == root {
            same_len("reduce", send.len(), recv.len())?;
        }
        self.collective(
            Coll::Reduce {
                count: send.len(),
                root,
            },
            T::DTYPE,
            op,
            bufs(ro(send), rw(recv)),
        )
    }

    /// In-place reduce: the root's `buf` receives the result.
    pub fn reduce_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        self.check_root("reduce", root)?;
        let r = rw(buf);
        self.collective(
            Coll::Reduce {
                count: buf.len(),
                root,
            },
            T::DTYPE,
            op,
            bufs(r, r),
        )
    }

    /// Gathers every rank's `send` into `recv` (rank order) on every rank.
    pub fn all_gather<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        same_len(
            "all_gather (recv = send × nranks)",
            send.len() * self.nranks,
            recv.len(),
        )?;
        self.collective(
            Coll::AllGather {
                send_count: send.len(),
            },
            T::DTYPE,
            RedOp::Sum,
            bufs(ro(send), rw(recv)),
        )
    }

    /// In-place all-gather: this rank's input is `buf[rank*c..(rank+1)*c]`.
    pub fn all_gather_in_place<T: Element>(&mut self, buf: &mut [T]) -> Result<()> {
        let c = self.equal_parts("all_gather", buf.len())?;
        let out = rw(buf);
        let input = rw(&mut buf[self.rank * c..(self.rank + 1) * c]);
        self.collective(
            Coll::AllGather { send_count: c },
            T::DTYPE,
            RedOp::Sum,
            bufs(input, out),
        )
    }

    /// Reduces `send` (nranks parts) and leaves part `rank` in `recv`.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: RedOp,
    ) -> Result<()> {
        same_len(
            "reduce_scatter (send = recv × nranks)",
            send.len(),
            recv.len() * self.nranks,
        )?;
        self.collective(
            Coll::ReduceScatter {
                recv_count: recv.len(),
            },
            T::DTYPE,
            op,
            bufs(ro(send), rw(recv)),
        )
    }

    /// In-place reduce-scatter: the result lands in `buf[rank*c..(rank+1)*c]`.
    pub fn reduce_scatter_in_place<T: Element>(&mut self, buf: &mut [T], op: RedOp) -> Result<()> {
        let c = self.equal_parts("reduce_scatter", buf.len())?;
        let input = rw(buf);
        let out = rw(&mut buf[self.rank * c..(self.rank + 1) * c]);
        self.collective(
            Coll::ReduceScatter { recv_count: c },
            T::DTYPE,
            op,
            bufs(input, out),
        )
    }

    /// Sends part `p` of `send` to rank `p`, and receives rank `p`'s part
    /// `rank` into part `p` of `recv`.
    pub fn all_to_all<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        same_len("all_to_all", send.len(), recv.len())?;
        let c = self.equal_parts("all_to_all", send.len())?;
        self.collective(
            Coll::AllToAll { count: c },
            T::DTYPE,
            RedOp::Sum,
            bufs(ro(send), rw(recv)),
        )
    }

    /// In-place all-to-all (through a copy of the input in a staging buffer
    /// the communicator keeps for the next call).
    pub fn all_to_all_in_place<T: Element>(&mut self, buf: &mut [T]) -> Result<()> {
        let c = self.equal_parts("all_to_all", buf.len())?;
        let r = rw(buf);
        self.collective(
            Coll::AllToAll { count: c },
            T::DTYPE,
            RedOp::Sum,
            bufs(r, r),
        )
    }

    /// Gathers every rank's `send` into `root`'s `recv`.
    pub fn gather<T: Element>(&mut self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.check_root("gather", root)?;
        if self.rank == root {
            same_len(
                "gather (recv = send × nranks)",
                send.len() * self.nranks,
                recv.len(),
            )?;
        }
        self.collective(
            Coll::Gather {
                count: send.len(),
                root,
            },
            T::DTYPE,
            RedOp::Sum,
            bufs(ro(send), rw(recv)),
        )
    }

    /// Sends part `p` of `root`'s `send` to rank `p`'s `recv`.
    pub fn scatter<T: Element>(&mut self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.check_root("scatter", root)?;
        if self.rank == root {
            same_len(
                "scatter (send = recv × nranks)",
                send.len(),
                recv.len() * self.nranks,
            )?;
        }
        self.collective(
            Coll::Scatter {
                count: recv.len(),
                root,
            },
            T::DTYPE,
            RedOp::Sum,
            bufs(ro(send), rw(recv)),
        )
    }

    /// Waits until every rank has called `barrier`.
    pub fn barrier(&mut self) -> Result<()> {
        let mut one = [0u8];
        self.all_reduce_in_place(&mut one, RedOp::Max)
    }

    /// All-reduce on untyped bytes holding elements of `dtype` (for the C
    /// ABI and tools that choose the type at run time). `send == None`
    /// means in place.
    pub fn all_reduce_bytes(
        &mut self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        if recv.len() % dtype.size() != 0 || send.is_some_and(|s| s.len() != recv.len()) {
            return Err(Error::invalid(
                "all_reduce: buffer sizes do not match the datatype",
            ));
        }
        let out = rw(recv);
        let input = send.map(ro).unwrap_or(out);
        self.collective(
            Coll::AllReduce {
                count: recv.len() / dtype.size(),
            },
            dtype,
            op,
            bufs(input, out),
        )
    }
}
