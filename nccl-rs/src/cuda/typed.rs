//! Typed collectives on cudarc device buffers (`CudaSlice<T>`), ordered on
//! a `CudaStream`: the Rust API for device memory.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use nccl_rs::cuda::{cudarc::driver::CudaContext, Stager};
//! use nccl_rs::{Communicator, Config, RedOp};
//! nccl_rs::cuda::probe()?; // a clean error without a GPU
//! let config = Config::from_env()?;
//! let mut comm = Communicator::init_from_env(&config)?;
//! let ctx = CudaContext::new(0)?;
//! let stream = ctx.default_stream();
//! let send = stream.clone_htod(&vec![comm.rank() as f32; 1 << 20])?;
//! let mut recv = stream.alloc_zeros::<f32>(1 << 20)?;
//! let mut stager = Stager::from_env()?;
//! stager.all_reduce(&mut comm, &send, &mut recv, RedOp::Sum, &stream)?;
//! let sum = stream.clone_dtoh(&recv)?; // ordered after the all-reduce
//! # Ok(()) }
//! ```

use super::stage::{Stager, Stream};
use crate::comm::raw::{RawArgs, RawColl, RawP2p};
use crate::datatype::{Element, RedOp};
use crate::error::{Error, Result};
use crate::Communicator;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

fn len_check(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::InvalidArgument(format!(
            "{what}: {got} elements, expected {want}"
        )));
    }
    Ok(())
}

impl Stager {
    #[allow(clippy::too_many_arguments)]
    fn typed<T: Element + DeviceRepr>(
        &mut self,
        comm: &mut Communicator,
        coll: RawColl,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        count: usize,
        op: RedOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let (rp, _rg) = recv.device_ptr_mut(stream);
        let sg = send.map(|s| s.device_ptr(stream));
        let sp = sg.as_ref().map_or(rp, |(p, _)| *p) as *const u8;
        let args = RawArgs {
            coll,
            send: sp,
            recv: rp as *mut u8,
            count,
            dtype: T::DTYPE,
            op,
            root,
        };
        // SAFETY: the slices are live device allocations of the lengths
        // checked by the callers, borrowed (the receive one exclusively)
        // for the call; cudarc's guards order them on `stream`, where our
        // copies run.
        unsafe { self.collective(comm, &args, Stream::from_raw(stream.cu_stream()), None) }
    }

    /// All-reduce of `send` into `recv` (same length), on `stream`.
    pub fn all_reduce<T: Element + DeviceRepr>(
        &mut self,
        comm: &mut Communicator,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        op: RedOp,
        stream: &CudaStream,
    ) -> Result<()> {
        len_check("all_reduce recv", recv.len(), send.len())?;
        self.typed(
            comm,
            RawColl::AllReduce,
            Some(send),
            recv,
            send.len(),
            op,
            0,
            stream,
        )
    }

    /// All-reduce in place.
    pub fn all_reduce_in_place<T: Element + DeviceRepr>(
        &mut self,
        comm: &mut Communicator,
        buf: &mut CudaSlice<T>,
        op: RedOp,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = buf.len();
        self.typed(comm, RawColl::AllReduce, None, buf, n, op, 0, stream)
    }

    /// All-gather: `recv` holds `size() * send.len()` elements, rank r's
    /// part at `r * send.len()`.
    pub fn all_gather<T: Element + DeviceRepr>(
        &mut self,
        comm: &mut Communicator,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<()> {
        len_check("all_gather recv", recv.len(), send.len() * comm.size())?;
        self.typed(
            comm,
            RawColl::AllGather,
            Some(send),
            recv,
            send.len(),
            RedOp::Sum,
            0,
            stream,
        )
    }

    /// Reduce-scatter: `send` holds `size() * recv.len()` elements.
    pub fn reduce_scatter<T: Element + DeviceRepr>(
        &mut self,
        comm: &mut Communicator,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        op: RedOp,
        stream: &CudaStream,
    ) -> Result<()> {
        len_check("reduce_scatter send", send.len(), recv.len() * comm.size())?;
        self.typed(
            comm,
            RawColl::ReduceScatter,
            Some(send),
            recv,
            recv.len(),
            op,
            0,
            stream,
        )
    }

    /// Broadcast of `buf` from `root`, in place.
    pub fn broadcast<T: Element + DeviceRepr>(
        &mut self,
        comm: &mut Communicator,
        buf: &mut CudaSlice<T>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = buf.len();
        self.typed(
            comm,
            RawColl::Broadcast,
            None,
            buf,
            n,
            RedOp::Sum,
            root,
            stream,
        )
    }

    /// Sends and receives that run together (as `ncclGroupStart` … `End`):
    /// `sends` are (buffer, peer), `recvs` (buffer, peer), all on `stream`.
    pub fn send_recv<T: Element + DeviceRepr>(
        &mut self,
        comm: &mut Communicator,
        sends: &[(&CudaSlice<T>, usize)],
        recvs: &mut [(&mut CudaSlice<T>, usize)],
        stream: &CudaStream,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let st = Stream::from_raw(stream.cu_stream());
        let mut guards = Vec::new();
        let mut ops = Vec::new();
        for (buf, peer) in sends {
            let (p, g) = buf.device_ptr(stream);
            guards.push(g);
            ops.push((
                RawP2p {
                    is_send: true,
                    peer: *peer,
                    ptr: p as *mut u8,
                    bytes: buf.len() * es,
                },
                st,
            ));
        }
        for (buf, peer) in recvs.iter_mut() {
            let bytes = buf.len() * es;
            let (p, g) = buf.device_ptr_mut(stream);
            guards.push(g);
            ops.push((
                RawP2p {
                    is_send: false,
                    peer: *peer,
                    ptr: p as *mut u8,
                    bytes,
                },
                st,
            ));
        }
        let rank = comm.rank();
        // SAFETY: live device allocations of `bytes` each, borrowed for the
        // call (receive ones exclusively, so no overlap); the host view
        // `run` gets holds pinned buffers of the same sizes.
        unsafe { self.p2p(rank, &ops, |host| comm.run_group_raw(host)) }
    }
}
