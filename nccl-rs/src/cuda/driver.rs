//! Loading the CUDA driver without panicking, and the entry points we use.
//!
//! The driver library is opened at run time with `dlopen`, so nothing here
//! links against CUDA and the library loads on machines without it. We
//! resolve the few entry points we call ourselves, once, with `int`
//! results, instead of going through cudarc's loader: cudarc's generated
//! loaders either resolve every symbol of the bindings at once (0.19.0:
//! one symbol missing from an older driver and nothing loads) or panic on
//! a missing one, and they return `CUresult` as a Rust enum (a driver newer
//! than the bindings could return a code outside it). A missing library or
//! symbol is a [`CudaError`] here, never a panic, and the whole load also
//! runs inside `catch_unwind`. cudarc supplies the types and the typed
//! API on its `CudaSlice` (see `typed.rs`).
//!
//! `NCCL_RS_CUDA_DISABLE=1` turns CUDA off (everything is host memory).
//! `NCCL_RS_CUDA_DRIVER=/path/libcuda.so.1` loads that file instead of
//! `libcuda.so.1` (tests use it for a fake driver). Both are read from
//! [`crate::Config::global`].

use super::CudaError;
use cudarc::driver::sys::{CUcontext, CUdevice, CUdeviceptr, CUevent, CUstream};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::sync::OnceLock;

/// `CUDA_SUCCESS`.
pub(crate) const SUCCESS: c_int = 0;
/// `CUDA_ERROR_NO_DEVICE`.
pub(crate) const ERROR_NO_DEVICE: c_int = 100;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub(crate) const ERROR_INVALID_CONTEXT: c_int = 201;

/// `CUpointer_attribute` values (cuda.h; stable ABI).
pub(crate) mod ptr_attr {
    pub(crate) const CONTEXT: i32 = 1;
    pub(crate) const MEMORY_TYPE: i32 = 2;
    pub(crate) const IS_MANAGED: i32 = 8;
    pub(crate) const DEVICE_ORDINAL: i32 = 9;
}

/// `CUmemorytype` values.
pub(crate) mod mem_type {
    pub(crate) const DEVICE: u32 = 2;
    pub(crate) const UNIFIED: u32 = 4;
}

/// `CUdevice_attribute` values.
pub(crate) mod dev_attr {
    pub(crate) const PCI_BUS_ID: i32 = 33;
    pub(crate) const PCI_DEVICE_ID: i32 = 34;
    pub(crate) const UNIFIED_ADDRESSING: i32 = 41;
    pub(crate) const PCI_DOMAIN_ID: i32 = 50;
    pub(crate) const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub(crate) const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub(crate) const GPU_DIRECT_RDMA_SUPPORTED: i32 = 116;
    pub(crate) const DMA_BUF_SUPPORTED: i32 = 124;
}

/// `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING`: waiting threads
/// sleep instead of spinning (the CPU runs the host collective).
pub(crate) const EVENT_FLAGS: c_uint = 0x1 | 0x2;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned memory usable from every context.
pub(crate) const MEMHOSTALLOC_PORTABLE: c_uint = 0x1;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub(crate) const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

macro_rules! api {
    (
        required { $($name:ident : fn($($arg:ty),*);)* }
        optional { $($oname:ident : fn($($oarg:ty),*);)* }
    ) => {
        /// The driver entry points, resolved once.
        #[allow(non_snake_case)]
        pub(crate) struct Api {
            $(pub(crate) $name: unsafe extern "C" fn($($arg),*) -> c_int,)*
            $(pub(crate) $oname: Option<unsafe extern "C" fn($($oarg),*) -> c_int>,)*
        }

        impl Api {
            /// Resolves every entry point through `get` (name with its
            /// NUL → address).
            ///
            /// # Safety
            /// `get` must return addresses of the CUDA driver's functions
            /// of those names, from a library that is never unloaded.
            unsafe fn resolve(get: impl Fn(&[u8]) -> Option<*const c_void>) -> Result<Api, CudaError> {
                Ok(Api {
                    $($name: {
                        let p = get(concat!(stringify!($name), "\0").as_bytes())
                            .ok_or_else(|| CudaError::MissingSymbol(stringify!($name).into()))?;
                        // SAFETY: the driver exports this function with this
                        // C signature (cuda.h); `p` is its non-NULL address.
                        unsafe { std::mem::transmute::<*const c_void, unsafe extern "C" fn($($arg),*) -> c_int>(p) }
                    },)*
                    $($oname: get(concat!(stringify!($oname), "\0").as_bytes()).map(|p| {
                        // SAFETY: as above; optional (newer drivers only).
                        unsafe { std::mem::transmute::<*const c_void, unsafe extern "C" fn($($oarg),*) -> c_int>(p) }
                    }),)*
                })
            }
        }
    };
}

api! {
    required {
        cuInit: fn(c_uint);
        cuDriverGetVersion: fn(*mut c_int);
        cuDeviceGetCount: fn(*mut c_int);
        cuDeviceGet: fn(*mut CUdevice, c_int);
        cuDeviceGetName: fn(*mut c_char, c_int, CUdevice);
        cuDeviceGetAttribute: fn(*mut c_int, c_int, CUdevice);
        cuDeviceTotalMem_v2: fn(*mut usize, CUdevice);
        cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice);
        cuCtxSetCurrent: fn(CUcontext);
        cuCtxGetCurrent: fn(*mut CUcontext);
        cuCtxGetDevice: fn(*mut CUdevice);
        cuPointerGetAttribute: fn(*mut c_void, c_int, CUdeviceptr);
        cuMemAlloc_v2: fn(*mut CUdeviceptr, usize);
        cuMemFree_v2: fn(CUdeviceptr);
        cuMemHostAlloc: fn(*mut *mut c_void, usize, c_uint);
        cuMemFreeHost: fn(*mut c_void);
        cuMemcpyAsync: fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
        cuStreamGetCtx: fn(CUstream, *mut CUcontext);
        cuEventCreate: fn(*mut CUevent, c_uint);
        cuEventRecord: fn(CUevent, CUstream);
        cuEventSynchronize: fn(CUevent);
        cuEventDestroy_v2: fn(CUevent);
        cuGetErrorName: fn(c_int, *mut *const c_char);
    }
    optional {
        cuMemGetHandleForAddressRange: fn(*mut c_void, CUdeviceptr, usize, c_int, c_ulonglong);
    }
}

/// What the driver said at load time.
pub(crate) struct Driver {
    pub(crate) api: Api,
    /// The `dlopen` handle (never closed), for [`lookup`].
    handle: usize,
    pub(crate) version: i32,
    pub(crate) devices: i32,
}

/// The driver, loaded and initialised once per process; an error if CUDA
/// is disabled, absent, or has no device.
pub(crate) fn driver() -> Result<&'static Driver, CudaError> {
    static DRIVER: OnceLock<Result<Driver, CudaError>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            std::panic::catch_unwind(load).unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                Err(CudaError::Panicked(msg))
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The address of the driver's function `name` (NUL-terminated), if the
/// loaded driver exports it (entry points resolved by other modules,
/// e.g. `streamop.rs`).
pub(crate) fn lookup(name: &CStr) -> Option<*const c_void> {
    let d = driver().ok()?;
    // SAFETY: a symbol lookup in the driver library, which stays loaded.
    let p = unsafe { libc::dlsym(d.handle as *mut c_void, name.as_ptr()) };
    (!p.is_null()).then_some(p.cast_const())
}

/// The driver's entry points (the driver must be loaded).
pub(crate) fn api() -> Result<&'static Api, CudaError> {
    driver().map(|d| &d.api)
}

fn load() -> Result<Driver, CudaError> {
    let cfg = crate::Config::global().map_err(|e| CudaError::Unsupported(e.to_string()))?;
    if cfg.cuda.disable {
        return Err(CudaError::Disabled);
    }
    let handle = open_driver(cfg.cuda.driver.as_deref())?;
    let get = |name: &[u8]| {
        // SAFETY: `name` is NUL-terminated; looking a symbol up has no
        // side effect, and the address is only used as the function cuda.h
        // declares under that name.
        let p = unsafe { libc::dlsym(handle, name.as_ptr().cast()) };
        (!p.is_null()).then_some(p.cast_const())
    };
    // SAFETY: `get` resolves in the driver library, never unloaded.
    let api = unsafe { Api::resolve(get) }?;
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        match (api.cuInit)(0) {
            SUCCESS => {}
            ERROR_NO_DEVICE => return Err(CudaError::NoDevice),
            code => return Err(CudaError::call("cuInit", code, Some(&api))),
        }
        let mut version = 0;
        check(
            &api,
            "cuDriverGetVersion",
            (api.cuDriverGetVersion)(&mut version),
        )?;
        let mut devices = 0;
        check(
            &api,
            "cuDeviceGetCount",
            (api.cuDeviceGetCount)(&mut devices),
        )?;
        if devices < 1 {
            return Err(CudaError::NoDevice);
        }
        Ok(Driver {
            api,
            handle: handle as usize,
            version,
            devices,
        })
    }
}

/// Opens the driver library (`explicit`, from `NCCL_RS_CUDA_DRIVER`, else
/// `libcuda.so.1`, else `libcuda.so`) and keeps it loaded for the life of
/// the process, globally, so that cudarc's own loader finds the same
/// library.
fn open_driver(explicit: Option<&str>) -> Result<*mut c_void, CudaError> {
    let names: Vec<Vec<u8>> = match explicit {
        Some(p) => vec![p.as_bytes().to_vec()],
        None => vec![b"libcuda.so.1".to_vec(), b"libcuda.so".to_vec()],
    };
    let mut why = Vec::new();
    for name in names {
        let shown = String::from_utf8_lossy(&name).into_owned();
        let Ok(c) = std::ffi::CString::new(name) else {
            why.push(format!("{shown}: contains a NUL byte"));
            continue;
        };
        // SAFETY: a NUL-terminated name; the handle is deliberately never
        // closed.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if !h.is_null() {
            return Ok(h);
        }
        // SAFETY: dlerror returns NULL or a NUL-terminated message.
        let e = unsafe { libc::dlerror() };
        why.push(if e.is_null() {
            format!("{shown}: not found")
        } else {
            // SAFETY: non-NULL, NUL-terminated.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        });
    }
    match explicit {
        Some(p) => Err(CudaError::Unsupported(format!(
            "NCCL_RS_CUDA_DRIVER={}: {}",
            p,
            why.join("; ")
        ))),
        None => Err(CudaError::NotFound),
    }
}

/// `Ok` for `CUDA_SUCCESS`, else the call's error.
pub(crate) fn check(api: &Api, call: &'static str, code: c_int) -> Result<(), CudaError> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(CudaError::call(call, code, Some(api)))
    }
}

/// The driver's name for an error code (`CUDA_ERROR_...`).
pub(crate) fn error_name(api: Option<&Api>, code: c_int) -> String {
    let mut p: *const c_char = std::ptr::null();
    if let Some(api) = api {
        // SAFETY: valid out-pointer; the driver returns a static string.
        if unsafe { (api.cuGetErrorName)(code, &mut p) } == SUCCESS && !p.is_null() {
            // SAFETY: non-NULL static NUL-terminated string.
            return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        }
    }
    format!("CUresult {code}")
}

/// Raw handles are plain addresses to the driver; these wrappers let them
/// cross threads inside our types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Ctx(pub(crate) usize);

impl Ctx {
    pub(crate) fn raw(self) -> CUcontext {
        self.0 as CUcontext
    }
}

/// The retained primary context of device `ordinal` (cached; retained once
/// per process, as the CUDA runtime does).
pub(crate) fn primary_ctx(ordinal: i32) -> Result<Ctx, CudaError> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static CTXS: OnceLock<Mutex<HashMap<i32, Ctx>>> = OnceLock::new();
    let api = api()?;
    let mut map = CTXS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(c) = map.get(&ordinal) {
        return Ok(*c);
    }
    let mut dev: CUdevice = 0;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointers.
    unsafe {
        check(api, "cuDeviceGet", (api.cuDeviceGet)(&mut dev, ordinal))?;
        check(
            api,
            "cuDevicePrimaryCtxRetain",
            (api.cuDevicePrimaryCtxRetain)(&mut ctx, dev),
        )?;
    }
    let c = Ctx(ctx as usize);
    map.insert(ordinal, c);
    Ok(c)
}

/// The calling thread's current context, if any.
pub(crate) fn current_ctx() -> Option<Ctx> {
    let api = api().ok()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { (api.cuCtxGetCurrent)(&mut ctx) };
    (rc == SUCCESS && !ctx.is_null()).then_some(Ctx(ctx as usize))
}

/// Makes a context current on this thread until dropped, then restores
/// the previous one (a blocking call runs on the application's thread,
/// whose CUDA state must come back as it was).
pub(crate) struct CtxGuard {
    prev: Option<CUcontext>,
}

impl CtxGuard {
    pub(crate) fn bind(ctx: Ctx) -> Result<CtxGuard, CudaError> {
        let api = api()?;
        let mut prev: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `ctx` is a live context.
        unsafe {
            check(api, "cuCtxGetCurrent", (api.cuCtxGetCurrent)(&mut prev))?;
            if prev == ctx.raw() {
                return Ok(CtxGuard { prev: None });
            }
            check(api, "cuCtxSetCurrent", (api.cuCtxSetCurrent)(ctx.raw()))?;
        }
        Ok(CtxGuard { prev: Some(prev) })
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if let (Some(prev), Ok(api)) = (self.prev, api()) {
            // SAFETY: restores the context that was current before (or
            // none).
            let rc = unsafe { (api.cuCtxSetCurrent)(prev) };
            if rc != SUCCESS {
                tracing::warn!(
                    "restoring the CUDA context failed: {}",
                    error_name(Some(api), rc)
                );
            }
        }
    }
}

/// A CUDA event (blocking sync, no timing), destroyed on drop.
pub(crate) struct Event(CUevent);

// SAFETY: a CUevent is a driver handle usable from any thread.
unsafe impl Send for Event {}

impl Event {
    /// A new event in the current context.
    pub(crate) fn new() -> Result<Event, CudaError> {
        let api = api()?;
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(api, "cuEventCreate", unsafe {
            (api.cuEventCreate)(&mut e, EVENT_FLAGS)
        })?;
        Ok(Event(e))
    }

    pub(crate) fn record(&self, stream: CUstream) -> Result<(), CudaError> {
        let api = api()?;
        // SAFETY: live event; `stream` is the caller's stream of the
        // current context.
        check(api, "cuEventRecord", unsafe {
            (api.cuEventRecord)(self.0, stream)
        })
    }

    pub(crate) fn wait(&self) -> Result<(), CudaError> {
        let api = api()?;
        // SAFETY: live event.
        check(api, "cuEventSynchronize", unsafe {
            (api.cuEventSynchronize)(self.0)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: live event, destroyed once.
            unsafe { (api.cuEventDestroy_v2)(self.0) };
        }
    }
}

/// Pinned (page-locked, portable) host memory, freed on drop.
pub(crate) struct Pinned {
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for Pinned {}

impl Pinned {
    /// `bytes` of pinned memory (a context must be current).
    pub(crate) fn new(bytes: usize) -> Result<Pinned, CudaError> {
        let api = api()?;
        let cap = bytes.max(64).next_multiple_of(4096);
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(api, "cuMemHostAlloc", unsafe {
            (api.cuMemHostAlloc)(&mut p, cap, MEMHOSTALLOC_PORTABLE)
        })?;
        Ok(Pinned { ptr: p.cast(), cap })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn cap(&self) -> usize {
        self.cap
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: allocated by cuMemHostAlloc, freed once; no copy uses
            // it any more (owners wait for their events first).
            unsafe { (api.cuMemFreeHost)(self.ptr.cast()) };
        }
    }
}

/// Enqueues a copy of `bytes` from `src` to `dst` (any memory: unified
/// addressing) on `stream`.
///
/// # Safety
/// Both ranges must stay valid until the copy has run on the stream.
pub(crate) unsafe fn copy_async(
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    stream: CUstream,
) -> Result<(), CudaError> {
    let api = api()?;
    // SAFETY: forwarded contract.
    check(api, "cuMemcpyAsync", unsafe {
        (api.cuMemcpyAsync)(dst as CUdeviceptr, src as CUdeviceptr, bytes, stream)
    })
}
