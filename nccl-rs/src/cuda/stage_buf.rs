//! The stager's pinned buffers: each with the event recorded after the last
//! copy that uses it, and how the C ABI grows them ahead of a call.

use super::driver::{CtxGuard, Event, Pinned};
use super::pointer::{self, PtrInfo};
use super::retired::Retired;
use super::{op_ctx, CudaError, Stager, Stream};
use cudarc::driver::sys::CUstream;

/// One pinned buffer with the event recorded after the last copy that
/// uses it, and whether that copy may still be running.
#[derive(Default)]
pub(super) struct Buf {
    pub(super) mem: Option<Pinned>,
    pub(super) ev: Option<Event>,
    pub(super) pending: bool,
}

impl Buf {
    /// Waits for the last copy using this buffer.
    pub(super) fn settle(&mut self) -> std::result::Result<(), CudaError> {
        if self.pending {
            if let Some(ev) = &self.ev {
                ev.wait()?;
            }
            self.pending = false;
        }
        Ok(())
    }

    /// At least `bytes` of pinned memory, not in use by a copy. A buffer
    /// too small is replaced by one at least twice its size, and the old
    /// one goes to `retired` (never freed here: see [`Retired`]).
    pub(super) fn reserve(
        &mut self,
        bytes: usize,
        retired: &mut Retired,
    ) -> std::result::Result<*mut u8, CudaError> {
        self.settle()?;
        if self.ev.is_none() {
            self.ev = Some(Event::new()?);
        }
        self.grow(bytes, retired)?;
        Ok(self.mem.as_ref().map_or(std::ptr::null_mut(), Pinned::ptr))
    }

    /// At least `bytes` of pinned memory (maybe still used by a copy: the
    /// old buffer is retired, not freed).
    pub(super) fn grow(
        &mut self,
        bytes: usize,
        retired: &mut Retired,
    ) -> std::result::Result<(), CudaError> {
        let old = self.mem.as_ref().map_or(0, Pinned::cap);
        if self.mem.is_none() || old < bytes {
            let new = Pinned::new(bytes.max(old.saturating_mul(2)))?;
            if let Some(m) = self.mem.replace(new) {
                retired.pinned(m);
            }
        }
        Ok(())
    }

    pub(super) fn ptr(&self) -> *mut u8 {
        self.mem.as_ref().map_or(std::ptr::null_mut(), Pinned::ptr)
    }

    /// Records this buffer's event on `s` after the copies just enqueued.
    pub(super) fn mark(&mut self, s: CUstream) -> std::result::Result<(), CudaError> {
        if let Some(ev) = &self.ev {
            ev.record(s)?;
            self.pending = true;
        }
        Ok(())
    }
}

/// One pipeline slot: staged input and output of a chunk.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) inp: Buf,
    pub(super) out: Buf,
}

impl Stager {
    /// Grows the pinned staging buffers for a collective whose send and
    /// receive buffers hold `send_bytes` and `recv_bytes` (host path: at
    /// most one chunk of each is staged at a time), in the context of
    /// `stream` and `bufs`. The C ABI calls it before gating the call's
    /// stream (`ffi/src/gate.rs`), while the proxy is not running a call:
    /// the CUDA Programming Guide counts page-locked host allocations among
    /// the operations that synchronize streams implicitly, so allocating
    /// while a stream waits for the proxy is best avoided. Best effort:
    /// what a call still needs grows then (see `Retired`).
    pub fn reserve(
        &mut self,
        send_bytes: usize,
        recv_bytes: usize,
        stream: Stream,
        bufs: &[*const u8],
    ) -> std::result::Result<(), CudaError> {
        let infos: Vec<PtrInfo> = bufs.iter().map(|p| pointer::info(*p)).collect();
        if !infos.iter().any(PtrInfo::is_device) {
            return Ok(());
        }
        let step = |b: usize| match self.opts.pipeline {
            true => b.min(self.opts.chunk_bytes),
            false => b,
        };
        let (inp, out) = (step(send_bytes), step(recv_bytes));
        let slots = match self.opts.pipeline && send_bytes.max(recv_bytes) > inp.max(out) {
            true => 2,
            false => 1,
        };
        let ctx = op_ctx(stream, &infos)?;
        let _g = CtxGuard::bind(ctx)?;
        // The context our memory is freed in, if no call sets it first.
        self.ctx.get_or_insert(ctx);
        for slot in &mut self.slots[..slots] {
            slot.inp.grow(inp, &mut self.retired)?;
            slot.out.grow(out, &mut self.retired)?;
        }
        Ok(())
    }
}
