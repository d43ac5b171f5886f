//! Staged reductions whose arithmetic runs on the GPU (`dev_reduce`): the
//! host only moves bytes over the network, bandwidth-optimally.
//!
//! Per chunk of `len` elements, with `n` ranks, this rank `r`:
//! * **all-reduce**: device→host copy of the chunk (padded to `n` shards
//!   of `sh = ceil(len / n)`); all-to-all on the host, so that rank `r`
//!   holds every rank's shard `r`; host→device copy of those `n` shards
//!   into device scratch; the kernel reduces them in rank order into
//!   shard `r` of the output; device→host copy of that shard; all-gather
//!   on the host; host→device copies of the other shards into the
//!   output.
//! * **reduce-scatter**: the first half (blocks are the shards).
//! * **reduce**: gather to the root, which copies the `n` rows to the
//!   device and reduces them there.
//!
//! Every rank reduces the same rows in the same order, so results are
//! the same bits everywhere. `ncclAvg` divides in the kernel; a PreMulSum
//! scalar is applied by a scale kernel before the input leaves the
//! device. Stream semantics are those of the module docs of `stage.rs`;
//! the chunk after the current one is copied to the host while the
//! network works on the current one.

use super::{copy_async, cuda, Buf, PtrInfo, Retired, Slot, Stager, Stream};
use crate::comm::raw::{RawArgs, RawColl};
pub(super) use crate::cuda::dev_reduce::DevBuf;
use crate::cuda::dev_reduce::{self, DeviceReduce, Kernels};
use crate::cuda::driver::{Ctx, Event};
use crate::cuda::CudaError;
use crate::datatype::RedOp;
use crate::error::{Error, Result};
use crate::Communicator;
use std::sync::Arc;

type CudaResult<T> = std::result::Result<T, CudaError>;

/// The GPU path's state in a [`Stager`].
#[derive(Default)]
pub(super) struct GpuState {
    /// `NCCL_RS_CUDA_REDUCE`, read on first use.
    mode: Option<DeviceReduce>,
    /// Whether every rank of the communicator can reduce on its GPU
    /// (agreed once, on the first eligible call).
    agreed: Option<bool>,
    /// Rows to reduce, then PreMulSum inputs of two slots.
    scratch: Option<DevBuf>,
    /// Recorded after the last stream work that uses `scratch`.
    scratch_ev: Buf,
}

impl GpuState {
    /// Waits for stream work on our scratch (of `ctx`, current) and
    /// retires it: a call may be in flight, so nothing is freed here.
    pub(super) fn release(&mut self, ctx: Ctx, retired: &mut Retired) {
        if let Err(e) = self.scratch_ev.settle() {
            tracing::warn!("waiting for a device reduction failed: {e}");
        }
        self.scratch_ev.ev = None;
        if let Some(d) = self.scratch.take() {
            retired.device(Some(ctx), d);
        }
    }
}

/// The collectives this path runs.
pub(super) fn eligible(a: &RawArgs, si: &PtrInfo, ri: &PtrInfo, rb: usize) -> bool {
    matches!(
        a.coll,
        RawColl::AllReduce | RawColl::ReduceScatter | RawColl::Reduce
    ) && a.count > 0
        && si.is_device()
        && (rb == 0 || ri.is_device())
}

impl Stager {
    /// Where this stager's reductions run, instead of `NCCL_RS_CUDA_REDUCE`
    /// (set it alike on every rank, before the first reduction).
    pub fn set_device_reduce(&mut self, mode: DeviceReduce) {
        self.gpu.mode = Some(mode);
        self.gpu.agreed = None;
    }

    /// The kernels if this call reduces on the GPU (the context is
    /// entered). Agrees with the other ranks on the first call.
    pub(super) fn gpu_kernels(
        &mut self,
        comm: &mut Communicator,
        ctx: crate::cuda::driver::Ctx,
    ) -> Result<Option<Arc<Kernels>>> {
        let rank = comm.rank();
        let mode = match self.gpu.mode {
            Some(m) => m,
            None => *self.gpu.mode.insert(DeviceReduce::from_env()?),
        };
        if mode == DeviceReduce::Host || self.gpu.agreed == Some(false) {
            return Ok(None);
        }
        let k = dev_reduce::choose(mode, ctx).map_err(cuda(rank))?;
        if self.gpu.agreed.is_none() {
            // Every rank must take the same path: the minimum of "my GPU
            // can reduce" over the ranks.
            let mine = [i32::from(k.is_some())];
            let mut all = [0i32];
            let args = RawArgs {
                coll: RawColl::AllReduce,
                send: mine.as_ptr().cast(),
                recv: all.as_mut_ptr().cast(),
                count: 1,
                dtype: crate::DataType::Int32,
                op: RedOp::Min,
                root: 0,
            };
            // SAFETY: host buffers of one i32 each.
            unsafe { comm.collective_raw(&args) }?;
            let ok = all[0] == 1;
            if !ok && mode == DeviceReduce::Gpu {
                return Err(Error::InvalidArgument(
                    "NCCL_RS_CUDA_REDUCE=gpu, but another rank cannot reduce on its GPU".into(),
                ));
            }
            if !ok && k.is_some() {
                tracing::info!("device reductions: on the host (another rank cannot use its GPU)");
            }
            self.gpu.agreed = Some(ok);
        }
        Ok(if self.gpu.agreed == Some(true) {
            k
        } else {
            None
        })
    }

    /// Device scratch of at least `bytes` (our context current), waiting for
    /// earlier work on the old one before replacing it by one at least
    /// twice its size; the old one is retired, not freed (a call is in
    /// flight: see [`Retired`]).
    fn scratch(&mut self, bytes: usize) -> CudaResult<*mut u8> {
        let old = self.gpu.scratch.as_ref().map_or(0, DevBuf::cap);
        if self.gpu.scratch.is_none() || old < bytes {
            self.gpu.scratch_ev.settle()?;
            let new = DevBuf::new(bytes.max(old.saturating_mul(2)))?;
            if let Some(d) = self.gpu.scratch.replace(new) {
                self.retired.device(self.ctx, d);
            }
        }
        if self.gpu.scratch_ev.ev.is_none() {
            self.gpu.scratch_ev.ev = Some(Event::new()?);
        }
        Ok(self
            .gpu
            .scratch
            .as_ref()
            .map_or(std::ptr::null_mut(), DevBuf::ptr))
    }

    /// Runs `a` (all-reduce, reduce-scatter or reduce on device buffers)
    /// with the reductions on the GPU. The context is entered.
    ///
    /// # Safety
    /// As [`Stager::collective`].
    pub(super) unsafe fn collective_gpu(
        &mut self,
        comm: &mut Communicator,
        a: &RawArgs,
        k: &Kernels,
        stream: Stream,
        prescale: Option<&[u8]>,
    ) -> Result<()> {
        let (rank, n) = (comm.rank(), comm.size());
        let err = cuda(rank);
        let s = stream.effective();
        let es = a.dtype.size();
        let c = a.count;
        let coll = a.coll;
        let in_blocks = if coll == RawColl::ReduceScatter { n } else { 1 };
        let ce = match self.opts.pipeline {
            true => (self.opts.chunk_bytes / (es * in_blocks)).clamp(1, c),
            false => c,
        };
        let nchunks = c.div_ceil(ce);
        // Rows per chunk and their length (all-reduce: padded shards).
        let row_len = |len: usize| match coll {
            RawColl::AllReduce => len.div_ceil(n),
            _ => len,
        };
        let stage_bytes = n * row_len(ce).max(ce) * es;
        let pre_bytes = if prescale.is_some() {
            in_blocks * ce * es
        } else {
            0
        };
        let scratch = self
            .scratch(n * row_len(ce) * es + 2 * pre_bytes)
            .map_err(&err)?;
        let pre = |slot: usize| scratch.wrapping_add(n * row_len(ce) * es + slot * pre_bytes);
        for slot in &mut self.slots[..nchunks.min(2)] {
            slot.inp
                .reserve(stage_bytes, &mut self.retired)
                .map_err(&err)?;
            slot.out
                .reserve(stage_bytes, &mut self.retired)
                .map_err(&err)?;
        }
        tracing::trace!(
            "rank {rank}: {coll:?} of {c} {} reduced on the GPU in {nchunks} chunk(s)",
            a.dtype
        );
        let span = |k: usize| (k * ce, ce.min(c - k * ce));
        // Enqueues the device→host copies of chunk `i`'s input (scaled
        // first for PreMulSum) into `slot`.
        let stage_in = |slot: &mut Slot, i: usize| -> CudaResult<()> {
            let (s0, len) = span(i);
            for b in 0..in_blocks {
                let mut src = a.send.wrapping_add((b * c + s0) * es);
                if let Some(scalar) = prescale {
                    let dst = pre(i % 2).wrapping_add(b * len * es);
                    // SAFETY: `src` lies in the send buffer, `dst` in our
                    // scratch; both valid until the kernel ran.
                    unsafe { k.scale(a.dtype, dst, src, len, scalar, s) }?;
                    src = dst;
                }
                let dst = slot.inp.ptr().wrapping_add(b * len * es);
                // SAFETY: device source of `len` elements; pinned slot
                // reserved for the chunk, kept until the copy ran.
                unsafe { copy_async(dst, src, len * es, s) }?;
            }
            slot.inp.mark(s)
        };
        stage_in(&mut self.slots[0], 0).map_err(&err)?;
        for i in 0..nchunks {
            if i + 1 < nchunks {
                stage_in(&mut self.slots[(i + 1) % 2], i + 1).map_err(&err)?;
            }
            let (s0, len) = span(i);
            let sh = row_len(len);
            let slot = &mut self.slots[i % 2];
            slot.inp.settle().map_err(&err)?;
            slot.out.settle().map_err(&err)?;
            // The network: every rank's rows for this rank.
            let (xcoll, xcount) = match coll {
                RawColl::AllReduce => (RawColl::AllToAll, sh),
                RawColl::ReduceScatter => (RawColl::AllToAll, len),
                _ => (RawColl::Gather, len),
            };
            let x = RawArgs {
                coll: xcoll,
                send: slot.inp.ptr(),
                recv: slot.out.ptr(),
                count: xcount,
                ..*a
            };
            // SAFETY: pinned buffers of `n * xcount` elements, used by no
            // copy (settled above).
            unsafe { comm.collective_raw(&x) }?;
            if coll == RawColl::Reduce && rank != a.root {
                continue;
            }
            // Rows to the device, reduced in rank order.
            let rows = scratch;
            // SAFETY: scratch holds `n` rows of `row_len(ce) >= sh`;
            // the slot is kept until its event completes.
            unsafe { copy_async(rows, slot.out.ptr(), n * sh * es, s) }.map_err(&err)?;
            slot.out.mark(s).map_err(&err)?;
            let (off, valid) = match coll {
                RawColl::AllReduce => (rank * sh, sh.min(len.saturating_sub(rank * sh))),
                _ => (0, len),
            };
            let dst = a.recv.wrapping_add((s0 + off) * es);
            // SAFETY: `dst` lies in the receive buffer (device), `rows`
            // in scratch; both valid until the kernel ran.
            unsafe { k.reduce(a.dtype, a.op, dst, rows, sh, n, valid, n, s) }.map_err(&err)?;
            self.gpu.scratch_ev.mark(s).map_err(&err)?;
            if coll != RawColl::AllReduce {
                continue;
            }
            // Our reduced shard back to the host, then to every rank.
            let slot = &mut self.slots[i % 2];
            if valid > 0 {
                // SAFETY: `valid` elements of the receive buffer into our
                // pinned slot; we wait for the copy right below.
                unsafe { copy_async(slot.inp.ptr(), dst, valid * es, s) }.map_err(&err)?;
            }
            // Also orders the host after the kernel (and the copies before).
            slot.inp.mark(s).map_err(&err)?;
            slot.inp.settle().map_err(&err)?;
            slot.out.settle().map_err(&err)?;
            let g = RawArgs {
                coll: RawColl::AllGather,
                send: slot.inp.ptr(),
                recv: slot.out.ptr(),
                count: sh,
                ..*a
            };
            // SAFETY: pinned buffers of `sh` and `n * sh` elements, used
            // by no copy.
            unsafe { comm.collective_raw(&g) }?;
            for j in (0..n).filter(|&j| j != rank) {
                let valid = sh.min(len.saturating_sub(j * sh));
                if valid == 0 {
                    continue;
                }
                let dst = a.recv.wrapping_add((s0 + j * sh) * es);
                let src = slot.out.ptr().wrapping_add(j * sh * es);
                // SAFETY: shard j of the chunk in the receive buffer; the
                // pinned slot is kept until its event completes.
                unsafe { copy_async(dst, src, valid * es, s) }.map_err(&err)?;
            }
            slot.out.mark(s).map_err(&err)?;
        }
        Ok(())
    }
}
