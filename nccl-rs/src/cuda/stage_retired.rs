//! Staging memory a [`Stager`](super::Stager) replaced while calls may be
//! in flight: kept, not freed, until the stager is dropped.

use super::gpu::DevBuf;
use crate::cuda::driver::{Ctx, CtxGuard, Pinned};

/// Staging memory replaced while calls may be in flight, kept until the
/// [`Stager`](super::Stager) is dropped.
///
/// `cuMemFreeHost` and `cuMemFree` may synchronize implicitly with the
/// device. On the C ABI's proxy thread (`ffi/src/worker.rs`), the streams
/// of the call being run, and of calls queued after it, wait for a flag
/// that only the proxy raises, after the call: a synchronizing free there
/// would never return. So a buffer that has to grow is replaced, not
/// freed, and the old one waits here. The stager is dropped with its
/// communicator, after the proxy has stopped (its queue ran and every flag
/// was raised). Growth at least doubles a buffer, so what waits here is
/// less than what is in use.
#[derive(Default)]
pub(super) struct Retired {
    pinned: Vec<Pinned>,
    /// Device scratch, with the context it belongs to (if known).
    device: Vec<(Option<Ctx>, DevBuf)>,
    /// Bytes waiting here.
    bytes: usize,
}

impl Retired {
    pub(super) fn pinned(&mut self, m: Pinned) {
        self.note(m.cap());
        self.pinned.push(m);
    }

    pub(super) fn device(&mut self, ctx: Option<Ctx>, d: DevBuf) {
        self.note(d.cap());
        self.device.push((ctx, d));
    }

    fn note(&mut self, cap: usize) {
        self.bytes += cap;
        tracing::info!(
            "staging: an outgrown buffer of {cap} bytes is kept until the communicator is \
             destroyed ({} bytes kept)",
            self.bytes
        );
    }

    /// Takes in-use memory of a stager being dropped (not logged).
    pub(super) fn keep(&mut self, m: Pinned) {
        self.bytes += m.cap();
        self.pinned.push(m);
    }

    /// Frees everything on a thread of its own, with `ctx` current (no
    /// call of the stager may be in flight). A free may synchronize with
    /// the device, so it waits for every stream, the application's too:
    /// `ncclCommAbort` / `ncclCommDestroy` must return even while the
    /// application holds a stream (NCCL's abort does), so they do not wait
    /// for it.
    pub(super) fn free_detached(mut self, ctx: Option<Ctx>) {
        if self.pinned.is_empty() && self.device.is_empty() {
            return;
        }
        let bytes = self.bytes;
        let spawned = std::thread::Builder::new()
            .name("nccl-stage-free".into())
            .spawn(move || {
                let _g = ctx.map(CtxGuard::bind);
                self.free_all();
            });
        if let Err(e) = spawned {
            // The closure, and the memory with it, was dropped here.
            tracing::warn!("freeing {bytes} bytes of staging memory on a thread failed ({e})");
        }
    }

    /// Frees everything (no call may be in flight): device scratch in its
    /// own context.
    pub(super) fn free_all(&mut self) {
        for (ctx, d) in self.device.drain(..) {
            let _g = ctx.map(CtxGuard::bind);
            drop(d);
        }
        self.pinned.clear();
        self.bytes = 0;
    }
}
