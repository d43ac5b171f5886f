//! Stream memory operations: a CUDA stream that waits for the host.
//!
//! This is what lets a call on device buffers return at once (NCCL's
//! "the call enqueues, the stream completes the work"). At the call, on
//! the application's stream `s`, a [`Gate`] enqueues
//!
//! ```text
//!   s: ... earlier work ... | record event E | wait until *flag >= seq | later work ...
//! ```
//!
//! (`cuStreamWaitValue32` with `CU_STREAM_WAIT_VALUE_GEQ`, a wrap-around
//! comparison, on a [`HostFlag`] in mapped pinned memory). A proxy thread
//! then waits until E completed ([`Gate::wait_ready`]: polled, so it can
//! be cancelled and has a deadline), runs the staged collective on its own
//! non-blocking stream of the same context ([`ProxyStreams`]), waits for
//! that stream, and writes `seq` to the flag ([`HostFlag::release`]): the
//! application's stream continues and sees the results. The proxy's stream
//! must be non-blocking: a blocking one would wait for the legacy default
//! stream, which may be the one waiting for the flag.
//!
//! [`async_support`] probes once whether this works here: the driver
//! exports `cuStreamWaitValue32_v2` (available by default since CUDA
//! 11.7) or `cuStreamWaitValue32` with `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS`
//! on every device, and one trial wait on a flag already set completes.
//! `NCCL_RS_CUDA_ASYNC=0` turns it off (calls on device buffers then block
//! until the stream's earlier work is done, as before).
//!
//! Flags are never freed (a stream may still read one after its
//! communicator is gone); they come 64 bytes apart from pinned pages of
//! 4 KiB, one page per 64 communicators.

use super::driver::{self, check, Ctx, CtxGuard};
use super::pointer::{self, PtrInfo};
use super::stage::{op_ctx, Stream};
use super::CudaError;
use cudarc::driver::sys::{CUdeviceptr, CUevent, CUstream};
use std::ffi::{c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

mod gate;

use gate::InternalStream;
pub use gate::{Gate, GateWait, ProxyStreams};

/// `CU_STREAM_WAIT_VALUE_GEQ`: wait until `(int32_t)(*addr - value) >= 0`.
const STREAM_WAIT_VALUE_GEQ: c_uint = 0;
/// `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`.
const MEMHOSTALLOC_PORTABLE_DEVICEMAP: c_uint = 0x1 | 0x2;
/// `CU_EVENT_DISABLE_TIMING` (gate events are polled, not waited on).
const EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CUDA_ERROR_NOT_READY`.
const ERROR_NOT_READY: c_int = 600;
/// `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1` (needed by the v1 entry point).
const ATTR_CAN_USE_STREAM_MEM_OPS_V1: c_int = 92;
/// Bytes between two flags (one cache line each).
const FLAG_STRIDE: usize = 64;
const FLAG_PAGE: usize = 4096;

type WaitValue32 = unsafe extern "C" fn(CUstream, CUdeviceptr, u32, c_uint) -> c_int;
type HostGetDevicePointer = unsafe extern "C" fn(*mut CUdeviceptr, *mut c_void, c_uint) -> c_int;
type StreamCreate = unsafe extern "C" fn(*mut CUstream, c_uint) -> c_int;
type StreamDestroy = unsafe extern "C" fn(CUstream) -> c_int;
type EventQuery = unsafe extern "C" fn(CUevent) -> c_int;

/// The entry points of this module, resolved once.
struct MemOps {
    wait_value32: WaitValue32,
    /// `wait_value32` is `cuStreamWaitValue32_v2`.
    v2: bool,
    host_get_device_pointer: HostGetDevicePointer,
    stream_create: StreamCreate,
    stream_destroy: StreamDestroy,
    event_query: EventQuery,
}

fn sym<T: Copy>(name: &'static CStr) -> Result<T, CudaError> {
    let p = driver::lookup(name)
        .ok_or_else(|| CudaError::MissingSymbol(name.to_string_lossy().into_owned()))?;
    debug_assert_eq!(
        std::mem::size_of::<T>(),
        std::mem::size_of::<*const c_void>()
    );
    // SAFETY: `T` is the function pointer type cuda.h declares for `name`
    // (each call site names both), of pointer size; `p` is non-NULL.
    Ok(unsafe { std::mem::transmute_copy::<*const c_void, T>(&p) })
}

fn memops() -> Result<&'static MemOps, CudaError> {
    static OPS: OnceLock<Result<MemOps, CudaError>> = OnceLock::new();
    OPS.get_or_init(|| {
        driver::driver()?;
        let (wait_value32, v2) = match sym::<WaitValue32>(c"cuStreamWaitValue32_v2") {
            Ok(f) => (f, true),
            Err(_) => (sym::<WaitValue32>(c"cuStreamWaitValue32")?, false),
        };
        Ok(MemOps {
            wait_value32,
            v2,
            host_get_device_pointer: sym(c"cuMemHostGetDevicePointer_v2")?,
            stream_create: sym(c"cuStreamCreate")?,
            stream_destroy: sym(c"cuStreamDestroy_v2")?,
            event_query: sym(c"cuEventQuery")?,
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

static SUPPORT: OnceLock<Result<(), String>> = OnceLock::new();

/// Whether calls on device buffers may return before the stream's earlier
/// work is done: `Ok` when stream memory operations work here and
/// `NCCL_RS_CUDA_ASYNC` is not 0, else why not. Probed once per process (in
/// the calling thread's context, or device 0's); the outcome is logged
/// once at INFO.
pub fn async_support() -> Result<(), String> {
    SUPPORT
        .get_or_init(|| {
            let r = probe_async();
            match &r {
                Ok(()) => tracing::info!(
                    "device buffers: calls return at once; a proxy thread per communicator runs \
                     them and releases the stream with cuStreamWaitValue32 (NCCL_RS_CUDA_ASYNC=0 to block)"
                ),
                Err(why) => tracing::info!(
                    "device buffers: calls block until the stream's earlier work is done: {why}"
                ),
            }
            r
        })
        .clone()
}

/// [`async_support`], probed (the first time) in the context of a call on
/// `stream` with buffers `bufs`, so that no other device gets a context.
pub fn async_support_for(stream: Stream, bufs: &[*const u8]) -> Result<(), String> {
    if let Some(r) = SUPPORT.get() {
        return r.clone();
    }
    let _g = call_ctx(stream, bufs).ok().map(CtxGuard::bind);
    async_support()
}

/// The context of a call on `stream` with buffers `bufs`.
fn call_ctx(stream: Stream, bufs: &[*const u8]) -> Result<Ctx, CudaError> {
    let infos: Vec<PtrInfo> = bufs.iter().map(|p| pointer::info(*p)).collect();
    op_ctx(stream, &infos)
}

fn probe_async() -> Result<(), String> {
    let cfg = crate::Config::global().map_err(|e| e.to_string())?;
    if !cfg.cuda.async_calls {
        return Err("NCCL_RS_CUDA_ASYNC=0".into());
    }
    let d = driver::driver().map_err(|e| e.to_string())?;
    let ops = memops().map_err(|e| format!("no stream memory operations: {e}"))?;
    if !ops.v2 {
        for ordinal in 0..d.devices {
            let (mut dev, mut v) = (0, 0);
            // SAFETY: valid out-pointers.
            let ok = unsafe {
                (d.api.cuDeviceGet)(&mut dev, ordinal) == driver::SUCCESS
                    && (d.api.cuDeviceGetAttribute)(&mut v, ATTR_CAN_USE_STREAM_MEM_OPS_V1, dev)
                        == driver::SUCCESS
            };
            if !ok || v == 0 {
                return Err(format!(
                    "device {ordinal} cannot use stream memory operations \
                     (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS; NVreg_EnableStreamMemOPs=1)"
                ));
            }
        }
    }
    trial().map_err(|e| format!("a trial cuStreamWaitValue32 failed: {e}"))
}

/// One wait on a flag that is already set, on a new stream.
fn trial() -> Result<(), CudaError> {
    let ctx = match driver::current_ctx() {
        Some(c) => c,
        None => driver::primary_ctx(0)?,
    };
    let _g = CtxGuard::bind(ctx)?;
    let flag = HostFlag::new()?;
    flag.release(1);
    let s = InternalStream::new(ctx)?;
    let ops = memops()?;
    // SAFETY: a live stream of the current context; the flag is mapped
    // pinned memory that is never freed.
    let rc = unsafe { (ops.wait_value32)(s.raw(), flag.dev, 1, STREAM_WAIT_VALUE_GEQ) };
    check(driver::api()?, "cuStreamWaitValue32", rc)?;
    s.sync()
}

/// A 32-bit flag in mapped pinned host memory that streams can wait on.
/// Copyable handle; the memory lives for the rest of the process.
#[derive(Clone, Copy, Debug)]
pub struct HostFlag {
    host: usize,
    dev: CUdeviceptr,
}

/// Pages of flags: (host address, device address, flags handed out).
static FLAG_PAGES: Mutex<Vec<(usize, CUdeviceptr, usize)>> = Mutex::new(Vec::new());

impl HostFlag {
    /// [`new`](Self::new) in the context of a call on `stream` with
    /// buffers `bufs`.
    pub fn new_for(stream: Stream, bufs: &[*const u8]) -> Result<HostFlag, CudaError> {
        let _g = CtxGuard::bind(call_ctx(stream, bufs)?)?;
        HostFlag::new()
    }

    /// A new flag holding 0. Allocates a pinned page (in the current
    /// context, or device 0's) when the last one is used up.
    pub fn new() -> Result<HostFlag, CudaError> {
        let mut pages = FLAG_PAGES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((host, dev, used)) = pages.last_mut() {
            if *used < FLAG_PAGE / FLAG_STRIDE {
                let off = *used * FLAG_STRIDE;
                *used += 1;
                return Ok(HostFlag {
                    host: *host + off,
                    dev: *dev + off as CUdeviceptr,
                });
            }
        }
        let api = driver::api()?;
        let ops = memops()?;
        let ctx = match driver::current_ctx() {
            Some(c) => c,
            None => driver::primary_ctx(0)?,
        };
        let _g = CtxGuard::bind(ctx)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current.
        check(api, "cuMemHostAlloc", unsafe {
            (api.cuMemHostAlloc)(&mut p, FLAG_PAGE, MEMHOSTALLOC_PORTABLE_DEVICEMAP)
        })?;
        // SAFETY: `p` is FLAG_PAGE fresh bytes of host memory.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, FLAG_PAGE) };
        let mut dev: CUdeviceptr = 0;
        // SAFETY: `p` is mapped pinned memory from cuMemHostAlloc.
        let rc = unsafe { (ops.host_get_device_pointer)(&mut dev, p, 0) };
        if let Err(e) = check(api, "cuMemHostGetDevicePointer", rc) {
            // SAFETY: allocated above, not handed out.
            unsafe { (api.cuMemFreeHost)(p) };
            return Err(e);
        }
        pages.push((p as usize, dev, 1));
        Ok(HostFlag {
            host: p as usize,
            dev,
        })
    }

    fn atomic(&self) -> &AtomicU32 {
        // SAFETY: `host` is a 64-byte aligned slot of a pinned page that
        // is never freed, written only through atomics.
        unsafe { &*(self.host as *const AtomicU32) }
    }

    /// The current value.
    pub fn value(&self) -> u32 {
        self.atomic().load(Ordering::Acquire)
    }

    /// Raises the flag to `seq` (wrap-around order, as the stream compares),
    /// never lowering it: streams waiting for `seq` or less continue.
    pub fn release(&self, seq: u32) {
        let a = self.atomic();
        let mut cur = a.load(Ordering::Acquire);
        while (seq.wrapping_sub(cur) as i32) > 0 {
            match a.compare_exchange_weak(cur, seq, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }
}

pub(super) fn query(raw: usize) -> Result<bool, CudaError> {
    let ops = memops()?;
    // SAFETY: a live event.
    match unsafe { (ops.event_query)(raw as CUevent) } {
        driver::SUCCESS => Ok(true),
        ERROR_NOT_READY => Ok(false),
        rc => Err(CudaError::call("cuEventQuery", rc, driver::api().ok())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_release_is_monotonic_with_wraparound() {
        let cell = Box::new(AtomicU32::new(0));
        let f = HostFlag {
            host: &*cell as *const AtomicU32 as usize,
            dev: 0,
        };
        f.release(3);
        assert_eq!(f.value(), 3);
        f.release(2);
        assert_eq!(f.value(), 3);
        cell.store(u32::MAX - 1, Ordering::Release);
        f.release(1); // 1 comes after u32::MAX - 1 in wrap-around order
        assert_eq!(f.value(), 1);
        f.release(u32::MAX);
        assert_eq!(f.value(), 1);
    }
}
