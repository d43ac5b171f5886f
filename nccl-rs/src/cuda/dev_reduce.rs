//! Reductions on the GPU: the kernels of `kernels.cu` compiled with NVRTC
//! once per context, loaded with `cuModuleLoadData`, and launched on the
//! caller's stream; device scratch memory.
//!
//! `NCCL_RS_CUDA_REDUCE` chooses where staged reductions run: `gpu` (fail
//! when the kernels cannot be built), `host` (reduce on the CPU), or
//! `auto` (default: the GPU when the kernels load, else the host). One
//! INFO line says which path was taken and why.

use super::driver::{self, check, Ctx};
use super::{kernels, nvrtc, CudaError};
use crate::datatype::{DataType, RedOp};
use crate::error::Result;
use cudarc::driver::sys::CUstream;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

pub use crate::config::DeviceReduce;

impl DeviceReduce {
    /// `NCCL_RS_CUDA_REDUCE` of the process environment
    /// ([`crate::Config::global`]; unset: `Auto`).
    pub fn from_env() -> Result<DeviceReduce> {
        Ok(crate::Config::global()?.cuda.reduce)
    }
}

type CUmodule = *mut c_void;
type CUfunction = *mut c_void;
type LoadDataFn = unsafe extern "C" fn(*mut CUmodule, *const c_void) -> c_int;
type GetFunctionFn = unsafe extern "C" fn(*mut CUfunction, CUmodule, *const c_char) -> c_int;
type LaunchFn = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;

/// The module entry points of the driver (looked up, not required: the
/// staging path works without them).
struct ModApi {
    load_data: LoadDataFn,
    get_function: GetFunctionFn,
    launch: LaunchFn,
}

fn mod_api() -> Result<&'static ModApi, CudaError> {
    static API: OnceLock<Result<ModApi, CudaError>> = OnceLock::new();
    API.get_or_init(|| {
        let get = |n: &CStr| {
            driver::lookup(n)
                .ok_or_else(|| CudaError::MissingSymbol(n.to_string_lossy().into_owned()))
        };
        let (l, g, k) = (
            get(c"cuModuleLoadData")?,
            get(c"cuModuleGetFunction")?,
            get(c"cuLaunchKernel")?,
        );
        // SAFETY: the driver's functions of these names have these C
        // signatures (cuda.h).
        unsafe {
            Ok(ModApi {
                load_data: std::mem::transmute::<*const c_void, LoadDataFn>(l),
                get_function: std::mem::transmute::<*const c_void, GetFunctionFn>(g),
                launch: std::mem::transmute::<*const c_void, LaunchFn>(k),
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The kernels loaded in one context.
pub(crate) struct Kernels {
    funcs: HashMap<String, usize>,
    /// How they were built, for the INFO line.
    pub(crate) built: String,
}

// SAFETY: CUfunction handles are usable from any thread of the process
// (with their context current).
unsafe impl Send for Kernels {}
// SAFETY: as above; the map is read-only after construction.
unsafe impl Sync for Kernels {}

/// The kernels of `ctx` (which must be current), compiled and loaded on
/// first use; a failure is remembered too.
pub(crate) fn kernels(ctx: Ctx) -> std::result::Result<Arc<Kernels>, CudaError> {
    type Cache = HashMap<usize, std::result::Result<Arc<Kernels>, CudaError>>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let mut map = CACHE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    map.entry(ctx.0)
        .or_insert_with(|| build().map(Arc::new))
        .clone()
}

fn build() -> std::result::Result<Kernels, CudaError> {
    let api = driver::api()?;
    let m = mod_api()?;
    let mut dev = 0;
    // SAFETY: valid out-pointer; the context is current (caller).
    check(api, "cuCtxGetDevice", unsafe {
        (api.cuCtxGetDevice)(&mut dev)
    })?;
    let attr = |a: c_int| {
        let mut v = 0;
        // SAFETY: valid out-pointer and device.
        (unsafe { (api.cuDeviceGetAttribute)(&mut v, a, dev) } == driver::SUCCESS).then_some(v)
    };
    use driver::dev_attr as A;
    let cc = (
        attr(A::COMPUTE_CAPABILITY_MAJOR).unwrap_or(0),
        attr(A::COMPUTE_CAPABILITY_MINOR).unwrap_or(0),
    );
    let (ptx, arch) = nvrtc::compile_ptx(kernels::SOURCE, "ncclrs_kernels.cu", cc)?;
    let mut module: CUmodule = std::ptr::null_mut();
    // SAFETY: NUL-terminated PTX; valid out-pointer; context current.
    let rc = unsafe { (m.load_data)(&mut module, ptx.as_ptr().cast()) };
    check(api, "cuModuleLoadData", rc)?;
    // The module stays loaded for the life of the context.
    let mut funcs = HashMap::new();
    for name in kernels::all_names() {
        let c = CString::new(name.clone()).map_err(|_| CudaError::Unsupported(name.clone()))?;
        let mut f: CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module; NUL-terminated name; out-pointer.
        check(api, "cuModuleGetFunction", unsafe {
            (m.get_function)(&mut f, module, c.as_ptr())
        })?;
        funcs.insert(name, f as usize);
    }
    Ok(Kernels {
        funcs,
        built: format!(
            "{}, compute_{arch} PTX for sm_{}{}",
            nvrtc::describe().unwrap_or_default(),
            cc.0,
            cc.1
        ),
    })
}

/// Threads per block of our launches.
const BLOCK: u32 = 256;

impl Kernels {
    fn launch(
        &self,
        name: &str,
        count: usize,
        params: &mut [*mut c_void],
        stream: CUstream,
    ) -> std::result::Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        let api = driver::api()?;
        let m = mod_api()?;
        let f = *self
            .funcs
            .get(name)
            .ok_or_else(|| CudaError::Unsupported(format!("no kernel {name}")))?;
        let grid = count.div_ceil(BLOCK as usize).clamp(1, 1 << 16) as u32;
        // SAFETY: a kernel of the loaded module; `params` points at one
        // value per kernel parameter, of the kernel's types (callers);
        // the stream belongs to the current context.
        let rc = unsafe {
            (m.launch)(
                f as CUfunction,
                grid,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(api, "cuLaunchKernel", rc)
    }

    /// Enqueues `dst[i] = src[i] op src[stride + i] op ...` over `nsrc`
    /// rows (rank order), then `/ avg_n` for `RedOp::Avg`, on `stream`.
    ///
    /// # Safety
    /// Device pointers valid for `count` elements (`dst`) and `nsrc` rows
    /// of `stride` (`src`) until the kernel ran; `count <= stride`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn reduce(
        &self,
        dtype: DataType,
        op: RedOp,
        dst: *mut u8,
        src: *const u8,
        stride: usize,
        nsrc: usize,
        count: usize,
        avg_n: usize,
        stream: CUstream,
    ) -> std::result::Result<(), CudaError> {
        let mut dst = dst as u64;
        let mut src = src as u64;
        let mut stride = stride as u64;
        let mut nsrc = nsrc as u32;
        let mut count64 = count as u64;
        let mut avg = if op == RedOp::Avg { avg_n as u64 } else { 0 };
        let mut params: [*mut c_void; 6] = [
            (&mut dst as *mut u64).cast(),
            (&mut src as *mut u64).cast(),
            (&mut stride as *mut u64).cast(),
            (&mut nsrc as *mut u32).cast(),
            (&mut count64 as *mut u64).cast(),
            (&mut avg as *mut u64).cast(),
        ];
        self.launch(&kernels::reduce_name(dtype, op), count, &mut params, stream)
    }

    /// Enqueues `dst[i] = src[i] * scalar` (one element's bytes) on
    /// `stream`.
    ///
    /// # Safety
    /// Device pointers valid for `count` elements until the kernel ran.
    pub(crate) unsafe fn scale(
        &self,
        dtype: DataType,
        dst: *mut u8,
        src: *const u8,
        count: usize,
        scalar: &[u8],
        stream: CUstream,
    ) -> std::result::Result<(), CudaError> {
        let mut bits = [0u8; 8];
        let n = scalar.len().min(8);
        bits[..n].copy_from_slice(&scalar[..n]);
        let mut dst = dst as u64;
        let mut src = src as u64;
        let mut count64 = count as u64;
        let mut s = u64::from_le_bytes(bits);
        let mut params: [*mut c_void; 4] = [
            (&mut dst as *mut u64).cast(),
            (&mut src as *mut u64).cast(),
            (&mut count64 as *mut u64).cast(),
            (&mut s as *mut u64).cast(),
        ];
        self.launch(&kernels::scale_name(dtype), count, &mut params, stream)
    }
}

/// Which path staged reductions take in `ctx` (current), by `mode`:
/// `Some(kernels)` for the GPU, `None` for the host. `Gpu` without
/// kernels is an error. Logs the choice once per process.
pub(crate) fn choose(
    mode: DeviceReduce,
    ctx: Ctx,
) -> std::result::Result<Option<Arc<Kernels>>, CudaError> {
    static ANNOUNCED: OnceLock<()> = OnceLock::new();
    let got = match mode {
        DeviceReduce::Host => Err(CudaError::Unsupported("NCCL_RS_CUDA_REDUCE=host".into())),
        _ => kernels(ctx),
    };
    match (&got, mode) {
        (Err(e), DeviceReduce::Gpu) => {
            return Err(CudaError::Unsupported(format!(
                "NCCL_RS_CUDA_REDUCE=gpu, but the reduction kernels cannot be loaded: {e}"
            )))
        }
        (Ok(k), _) => {
            ANNOUNCED.get_or_init(|| {
                tracing::info!("device reductions: on the GPU ({})", k.built);
            });
        }
        (Err(e), _) => {
            ANNOUNCED.get_or_init(|| {
                tracing::info!("device reductions: on the host ({e})");
            });
        }
    }
    Ok(got.ok())
}

/// Device memory (`cuMemAlloc` in the current context), freed on drop
/// (with the same context current: the owner's job).
pub(crate) struct DevBuf {
    ptr: u64,
    cap: usize,
}

// SAFETY: a device address owned by this value.
unsafe impl Send for DevBuf {}

impl DevBuf {
    pub(crate) fn new(bytes: usize) -> std::result::Result<DevBuf, CudaError> {
        let api = driver::api()?;
        let cap = bytes.max(256).next_multiple_of(4096);
        let mut p = 0;
        // SAFETY: valid out-pointer; a context is current (caller).
        check(api, "cuMemAlloc", unsafe {
            (api.cuMemAlloc_v2)(&mut p, cap)
        })?;
        Ok(DevBuf { ptr: p, cap })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    pub(crate) fn cap(&self) -> usize {
        self.cap
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if let Ok(api) = driver::api() {
            // SAFETY: allocated by cuMemAlloc, freed once; no stream work
            // uses it any more (the owner settled its copies first).
            unsafe { (api.cuMemFree_v2)(self.ptr) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_parses() {
        assert_eq!(DeviceReduce::parse(None).unwrap(), DeviceReduce::Auto);
        assert_eq!(
            DeviceReduce::parse(Some(" GPU ")).unwrap(),
            DeviceReduce::Gpu
        );
        assert_eq!(
            DeviceReduce::parse(Some("host")).unwrap(),
            DeviceReduce::Host
        );
        assert_eq!(DeviceReduce::parse(Some("")).unwrap(), DeviceReduce::Auto);
        assert!(DeviceReduce::parse(Some("fpga")).is_err());
    }
}
