//! Blocking copies, stream waits and device selection for callers outside
//! the staging engine (tools and tests that fill and check device buffers).

use super::driver::{self, CtxGuard};
use super::stage::{op_ctx, Stream};
use super::{pointer, CudaError};

/// Copies `bytes` from `src` to `dst` (host or device memory, in either
/// direction), ordered after the work already on `stream`, and waits for
/// the copy to finish.
///
/// # Safety
/// `src` must be readable and `dst` writable for `bytes` bytes once
/// `stream` reaches this point; `stream` must be live (or 0, 1, 2).
pub unsafe fn copy_bytes(
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    stream: Stream,
) -> Result<(), CudaError> {
    if bytes == 0 {
        return Ok(());
    }
    let infos = [pointer::info(dst.cast_const()), pointer::info(src)];
    if !infos.iter().any(|i| i.is_device()) {
        // SAFETY: host memory on both sides (contract); `copy` allows
        // overlap.
        unsafe { std::ptr::copy(src, dst, bytes) };
        return Ok(());
    }
    let _g = CtxGuard::bind(op_ctx(stream, &infos)?)?;
    let s = stream.effective();
    // SAFETY: forwarded contract; we wait for the copy below.
    unsafe { driver::copy_async(dst, src, bytes, s) }?;
    let ev = driver::Event::new()?;
    ev.record(s)?;
    ev.wait()
}

/// Waits until the work enqueued on `stream` so far has run.
/// `device_ptr` (any device pointer the work used, or null) picks the
/// context of the special streams 0, 1 and 2.
pub fn synchronize(stream: Stream, device_ptr: *const u8) -> Result<(), CudaError> {
    let info = if device_ptr.is_null() {
        pointer::PtrInfo::HOST
    } else {
        pointer::info(device_ptr)
    };
    let _g = CtxGuard::bind(op_ctx(stream, &[info])?)?;
    let ev = driver::Event::new()?;
    ev.record(stream.effective())?;
    ev.wait()
}

/// Makes device `ordinal`'s primary context current on the calling thread
/// (what `cudaSetDevice` does): later [`device_alloc`](super::device_alloc)
/// calls on this thread allocate there.
pub fn set_device(ordinal: i32) -> Result<(), CudaError> {
    let api = driver::api()?;
    let ctx = driver::primary_ctx(ordinal)?;
    // SAFETY: a live, retained primary context.
    driver::check(api, "cuCtxSetCurrent", unsafe {
        (api.cuCtxSetCurrent)(ctx.raw())
    })
}
