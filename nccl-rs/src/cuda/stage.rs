//! Collectives and send/recv on device buffers, staged through pinned host
//! memory and ordered on a CUDA stream.
//!
//! # Stream semantics
//! A call on device buffers behaves as NCCL's on its stream `s`:
//! * it reads its input only after the work enqueued on `s` before the
//!   call (the device→host copies are enqueued on `s`, and the host waits
//!   for an event recorded after them);
//! * its results are written by host→device copies enqueued on `s`, so
//!   work enqueued on `s` after the call sees them, and
//!   `cuStreamSynchronize(s)` / `cudaStreamSynchronize(s)` waits for them.
//!
//! Run directly (the blocking path), the call returns once the network
//! part is done and the copies back are enqueued (the stream completes
//! them); it does not return before the stream's earlier work has produced
//! the input: unlike NCCL's kernels, the host has to wait for it.
//!
//! # Calls that return at once
//! The C ABI makes calls on device buffers return at once where stream
//! memory operations work (`streamop/`; `NCCL_RS_CUDA_ASYNC=0` turns it
//! off): each communicator then runs every call of it, in call order, on a
//! proxy thread (`ffi/src/worker.rs`, `ffi/src/gate.rs`). At the call, the
//! application's stream gets an event after its earlier work and a
//! `cuStreamWaitValue32` on a flag in mapped pinned memory; the proxy
//! waits for the event, runs the call through the [`Stager`] on its own
//! non-blocking stream of the same context, waits for that stream, and
//! raises the flag. (Host functions, `cuLaunchHostFunc`, cannot do it:
//! they may not call CUDA, and blocking in one would stall the other
//! ranks' host functions when ranks share a process.)
//!
//! While the proxy runs a call, the application's streams of that call and
//! of the calls queued after it wait for the proxy. So the stager never
//! frees driver memory during a call (`cuMemFreeHost` and `cuMemFree`
//! may synchronize implicitly with the device, which would wait for those
//! streams forever): an outgrown buffer is kept (`Retired`) until the
//! stager is dropped with its communicator, after the proxy stopped. To
//! allocate before the streams are gated where it can, the C ABI calls
//! [`Stager::reserve`] when it gates a collective.
//!
//! # Reductions
//! All-reduce, reduce-scatter and reduce reduce on the GPU when its
//! kernels load (`NCCL_RS_CUDA_REDUCE`, `stage_gpu.rs`): the host then only
//! moves bytes; otherwise the host collective reduces the staged copies.
//!
//! # Pipeline
//! A buffer larger than one chunk (`NCCL_RS_CUDA_STAGING_CHUNK`, 2 MiB by
//! default) runs as consecutive collectives on chunks. The device→host
//! copy of chunk k+1 is enqueued before the network works on chunk k, and
//! the copy back of chunk k is enqueued right after it, so copies in both
//! directions overlap the network. Two slots of pinned buffers alternate;
//! they are allocated on first use, grown when needed, and kept by the
//! [`Stager`] (one per communicator).

use super::driver::{self, copy_async, Ctx, CtxGuard};
use super::pointer::{self, PtrInfo};
use super::CudaError;
use crate::comm::raw::{RawArgs, RawColl};
use crate::datatype::scale_in_place;
use crate::error::{Error, Result};
use crate::Communicator;
use cudarc::driver::sys::{CUcontext, CUstream};

#[path = "stage_buf.rs"]
mod buf;
#[path = "stage_gpu.rs"]
mod gpu;
#[path = "stage_options.rs"]
mod options;
#[path = "stage_p2p.rs"]
mod p2p;
#[path = "stage_retired.rs"]
mod retired;
use buf::{Buf, Slot};
pub use options::{StagingOptions, Stream};
use retired::Retired;

/// Stages device buffers through pinned host memory for one communicator
/// (or several, used one at a time). Keeps its pinned buffers and events
/// between calls. `Send`, not `Sync`: one call at a time.
pub struct Stager {
    opts: StagingOptions,
    /// The context our events belong to.
    ctx: Option<Ctx>,
    slots: [Slot; 2],
    p2p: Vec<Buf>,
    /// The INFO line about the data path was logged.
    announced: bool,
    /// Reductions on the GPU (`stage_gpu.rs`).
    gpu: gpu::GpuState,
    /// Outgrown memory, freed on drop.
    retired: Retired,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("opts", &self.opts)
            .field("ctx", &self.ctx)
            .finish_non_exhaustive()
    }
}

impl Default for Stager {
    fn default() -> Self {
        Stager::new(StagingOptions::default())
    }
}

/// The context a call's CUDA work runs in: the stream's, or for the
/// special streams the thread's current context, or the buffer's.
pub(crate) fn op_ctx(stream: Stream, bufs: &[PtrInfo]) -> std::result::Result<Ctx, CudaError> {
    let api = driver::api()?;
    if stream.is_handle() {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a stream handle of the application; valid out-pointer.
        let rc = unsafe { (api.cuStreamGetCtx)(stream.effective(), &mut ctx) };
        driver::check(api, "cuStreamGetCtx", rc)?;
        return Ok(Ctx(ctx as usize));
    }
    let dev = bufs.iter().find(|b| b.is_device());
    if let (Some(cur), Some(d)) = (driver::current_ctx(), dev) {
        if d.ctx.is_none_or(|c| c == cur) {
            return Ok(cur);
        }
    }
    match dev {
        Some(PtrInfo { ctx: Some(c), .. }) => Ok(*c),
        Some(d) => driver::primary_ctx(d.ordinal().unwrap_or(0)),
        None => driver::current_ctx().map_or_else(|| driver::primary_ctx(0), Ok),
    }
}

fn cuda(rank: usize) -> impl Fn(CudaError) -> Error {
    move |e| e.into_error(rank)
}

/// Blocks of `count` elements in the input and output of `coll` (n for
/// the all-to-one and one-to-all layouts).
fn blocks(coll: RawColl, n: usize) -> (usize, usize) {
    match coll {
        RawColl::ReduceScatter | RawColl::Scatter => (n, 1),
        RawColl::AllGather | RawColl::Gather => (1, n),
        RawColl::AllToAll => (n, n),
        RawColl::AllReduce | RawColl::Broadcast | RawColl::Reduce => (1, 1),
    }
}

/// Copies `bytes` from `src` to `dst`: enqueued on `s` if either side is
/// device memory, else at once on the CPU.
///
/// # Safety
/// Both ranges valid (until the copy ran on `s`); no overlap.
unsafe fn copy(
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    device: bool,
    s: CUstream,
) -> std::result::Result<bool, CudaError> {
    if bytes == 0 {
        return Ok(false);
    }
    if device {
        // SAFETY: forwarded contract.
        unsafe { copy_async(dst, src, bytes, s) }?;
        Ok(true)
    } else {
        // SAFETY: forwarded contract; host memory on both sides.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
        Ok(false)
    }
}

impl Stager {
    /// A stager with these options. Allocates nothing until used.
    pub fn new(opts: StagingOptions) -> Stager {
        Stager {
            opts,
            ctx: None,
            slots: Default::default(),
            p2p: Vec::new(),
            announced: false,
            gpu: Default::default(),
            retired: Retired::default(),
        }
    }

    /// A stager with the options of the environment.
    pub fn from_env() -> Result<Stager> {
        Ok(Stager::new(StagingOptions::from_env()?))
    }

    /// Its options.
    pub fn options(&self) -> &StagingOptions {
        &self.opts
    }

    /// Whether a call on these buffers needs staging (one of them is
    /// device memory). False for everything without CUDA.
    pub fn needs_staging(ptrs: &[*const u8]) -> bool {
        driver::api().is_ok() && ptrs.iter().any(|p| pointer::info(*p).is_device())
    }

    /// Makes `ctx` current (until the guard drops) and moves our events
    /// there, settling the copies of the previous context first.
    fn enter(&mut self, ctx: Ctx) -> std::result::Result<CtxGuard, CudaError> {
        if self.ctx.is_some_and(|c| c != ctx) {
            self.release();
        }
        let g = CtxGuard::bind(ctx)?;
        self.ctx = Some(ctx);
        if !self.announced {
            self.announced = true;
            tracing::info!(
                "device buffers: staged through pinned host memory on the call's stream ({})",
                match self.opts.pipeline {
                    true => format!("pipelined in {} byte chunks", self.opts.chunk_bytes),
                    false => "whole buffers".into(),
                }
            );
        }
        Ok(g)
    }

    /// Waits for every copy still using our buffers and frees the events
    /// (in their context). Pinned memory is portable and stays; device
    /// scratch is retired (this runs between calls of the proxy too, when
    /// a call uses another context: nothing is freed, see [`Retired`]).
    fn release(&mut self) {
        let Some(old) = self.ctx.take() else { return };
        let Ok(_g) = CtxGuard::bind(old) else { return };
        let bufs = self
            .slots
            .iter_mut()
            .flat_map(|s| [&mut s.inp, &mut s.out])
            .chain(self.p2p.iter_mut());
        for b in bufs {
            if let Err(e) = b.settle() {
                tracing::warn!("waiting for a staging copy failed: {e}");
            }
            b.ev = None;
        }
        self.gpu.release(old, &mut self.retired);
    }

    /// Runs one collective of `comm` with NCCL's meanings of `a`, on any
    /// memory. With host memory only (always, without CUDA) it is
    /// `comm.collective_raw(a)`. With device memory it is staged and
    /// ordered on `stream` (see the module docs).
    ///
    /// `prescale`: multiply the input by this scalar (one element of
    /// `a.dtype`, as bytes) first: `ncclRedOpCreatePreMulSum`.
    ///
    /// # Safety
    /// As [`Communicator::collective_raw`], except that the buffers may be
    /// device memory, valid until the work enqueued on `stream` by this
    /// call has run; `stream` must be a live stream (or 0, 1, 2).
    pub unsafe fn collective(
        &mut self,
        comm: &mut Communicator,
        a: &RawArgs,
        stream: Stream,
        prescale: Option<&[u8]>,
    ) -> Result<()> {
        let (rank, n) = (comm.rank(), comm.size());
        let rooted = matches!(
            a.coll,
            RawColl::Broadcast | RawColl::Reduce | RawColl::Gather | RawColl::Scatter
        );
        if rooted && a.root >= n {
            return Err(Error::InvalidArgument(format!(
                "root {} is not a rank of {n}",
                a.root
            )));
        }
        let (sb, rb) = comm.raw_sizes(a);
        let es = a.dtype.size();
        for (what, p, len) in [
            ("sendbuff", a.send, sb),
            ("recvbuff", a.recv.cast_const(), rb),
        ] {
            if len > 0 && p.is_null() {
                return Err(Error::InvalidArgument(format!(
                    "{what} is NULL but {len} bytes are needed"
                )));
            }
            // Element sizes are powers of two.
            if len > 0 && (p as usize) & (es - 1) != 0 {
                return Err(Error::InvalidArgument(format!(
                    "{what} {p:?} is not aligned for {}",
                    a.dtype
                )));
            }
        }
        if let Some(s) = prescale {
            if s.len() != es {
                return Err(Error::InvalidArgument(format!(
                    "PreMulSum scalar of {} bytes for {}",
                    s.len(),
                    a.dtype
                )));
            }
        }
        let si = if sb > 0 {
            pointer::info(a.send)
        } else {
            PtrInfo::HOST
        };
        let ri = if rb > 0 {
            pointer::info(a.recv)
        } else {
            PtrInfo::HOST
        };
        if !si.is_device() && !ri.is_device() {
            return match prescale {
                // SAFETY: forwarded contract (host memory).
                None => unsafe { comm.collective_raw(a) },
                Some(scalar) => {
                    let mut copy = vec![0u64; sb.div_ceil(8)];
                    let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut copy)[..sb];
                    if sb > 0 {
                        // SAFETY: `send` is readable for `sb` bytes (contract).
                        bytes.copy_from_slice(unsafe { std::slice::from_raw_parts(a.send, sb) });
                    }
                    scale_in_place(a.dtype, bytes, scalar);
                    let args = RawArgs {
                        send: copy.as_ptr().cast(),
                        ..*a
                    };
                    // SAFETY: our aligned copy of the input; `recv` as the
                    // caller guarantees.
                    unsafe { comm.collective_raw(&args) }
                }
            };
        }
        if a.count == 0 {
            // SAFETY: nothing is read or written.
            return unsafe { comm.collective_raw(a) };
        }
        let err = cuda(rank);
        let ctx = op_ctx(stream, &[si, ri]).map_err(&err)?;
        let _g = self.enter(ctx).map_err(&err)?;
        if gpu::eligible(a, &si, &ri, rb) {
            if let Some(k) = self.gpu_kernels(comm, ctx)? {
                // SAFETY: forwarded contract.
                return unsafe { self.collective_gpu(comm, a, &k, stream, prescale) };
            }
        }
        let s = stream.effective();
        let c = a.count;
        let (in_blocks, out_blocks) = blocks(a.coll, n);
        let ce = match self.opts.pipeline {
            true => (self.opts.chunk_bytes / (es * in_blocks.max(out_blocks))).clamp(1, c),
            false => c,
        };
        let nchunks = c.div_ceil(ce);
        let in_bytes = |len: usize| if sb > 0 { in_blocks * len * es } else { 0 };
        let out_bytes = |len: usize| if rb > 0 { out_blocks * len * es } else { 0 };
        for slot in &mut self.slots[..nchunks.min(2)] {
            slot.inp
                .reserve(in_bytes(ce), &mut self.retired)
                .map_err(&err)?;
            slot.out
                .reserve(out_bytes(ce), &mut self.retired)
                .map_err(&err)?;
        }
        tracing::trace!(
            "rank {rank}: staging {:?} of {c} {} in {nchunks} chunk(s) on stream {:#x}",
            a.coll,
            a.dtype,
            stream.0
        );
        let span = |k: usize| (k * ce, ce.min(c - k * ce));
        // Enqueues (or, for host input, does) the copies of chunk k's
        // input into its slot.
        let stage_in = |slot: &mut Slot, k: usize| -> std::result::Result<(), CudaError> {
            let (s0, len) = span(k);
            if sb == 0 {
                return Ok(());
            }
            let mut queued = false;
            for b in 0..in_blocks {
                let src = a.send.wrapping_add((b * c + s0) * es);
                let dst = slot.inp.ptr().wrapping_add(b * len * es);
                // SAFETY: `src` lies in the caller's send buffer (block b,
                // elements s0..s0+len of count c), `dst` in our reserved
                // slot; both live until the copy ran (contract / we wait).
                queued |= unsafe { copy(dst, src, len * es, si.is_device(), s) }?;
            }
            if queued {
                slot.inp.mark(s)?;
            }
            Ok(())
        };
        stage_in(&mut self.slots[0], 0).map_err(&err)?;
        for k in 0..nchunks {
            if k + 1 < nchunks {
                stage_in(&mut self.slots[(k + 1) % 2], k + 1).map_err(&err)?;
            }
            let slot = &mut self.slots[k % 2];
            let (s0, len) = span(k);
            slot.inp.settle().map_err(&err)?;
            slot.out.settle().map_err(&err)?;
            if let (Some(scalar), true) = (prescale, sb > 0) {
                // SAFETY: the input copies of this chunk finished; the
                // slot holds `in_bytes(len)` bytes.
                let staged =
                    unsafe { std::slice::from_raw_parts_mut(slot.inp.ptr(), in_bytes(len)) };
                scale_in_place(a.dtype, staged, scalar);
            }
            let host = RawArgs {
                send: if sb > 0 {
                    slot.inp.ptr()
                } else {
                    std::ptr::null()
                },
                recv: if rb > 0 {
                    slot.out.ptr()
                } else {
                    std::ptr::null_mut()
                },
                count: len,
                op: a.op,
                ..*a
            };
            // SAFETY: pinned host buffers of the sizes NCCL defines for
            // `len` elements (reserved for `ce >= len`), used by no copy.
            unsafe { comm.collective_raw(&host) }?;
            if rb > 0 {
                let mut queued = false;
                for b in 0..out_blocks {
                    let dst = a.recv.wrapping_add((b * c + s0) * es);
                    let src = slot.out.ptr().wrapping_add(b * len * es);
                    // SAFETY: `dst` lies in the caller's receive buffer,
                    // `src` in our slot, kept until the copy ran (the
                    // slot's event is waited on before reuse).
                    queued |=
                        unsafe { copy(dst, src, len * es, ri.is_device(), s) }.map_err(&err)?;
                }
                if queued {
                    slot.out.mark(s).map_err(&err)?;
                }
            }
        }
        Ok(())
    }
}

/// The only place staging memory is freed: the stager goes with its
/// communicator, when no call of it is in flight (see `Retired`); the
/// frees run on a thread of their own (`Retired::free_detached`).
impl Drop for Stager {
    fn drop(&mut self) {
        let ctx = self.ctx;
        // Waits for our copies (not for the application's later work).
        self.release();
        let bufs = std::mem::take(&mut self.slots)
            .into_iter()
            .flat_map(|s| [s.inp, s.out])
            .chain(self.p2p.drain(..));
        for m in bufs.filter_map(|b| b.mem) {
            self.retired.keep(m);
        }
        std::mem::take(&mut self.retired).free_detached(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_layouts() {
        assert_eq!(blocks(RawColl::AllReduce, 4), (1, 1));
        assert_eq!(blocks(RawColl::AllGather, 4), (1, 4));
        assert_eq!(blocks(RawColl::ReduceScatter, 4), (4, 1));
        assert_eq!(blocks(RawColl::AllToAll, 4), (4, 4));
        assert_eq!(blocks(RawColl::Gather, 3), (1, 3));
        assert_eq!(blocks(RawColl::Scatter, 3), (3, 1));
    }
}
