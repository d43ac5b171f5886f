//! Device (GPU) buffers, behind the `cuda` feature.
//!
//! The CUDA driver is loaded at run time through cudarc (no CUDA toolkit to
//! build; the library loads on machines without a GPU). Every entry point
//! here works without one: [`probe`] returns a [`CudaError`], [`classify`]
//! says every pointer is host memory, and collectives on host memory take
//! the ordinary path. Nothing panics when CUDA is missing.
//!
//! # Pieces
//! * [`probe`]: the driver and its devices ([`CudaInfo`]).
//! * [`classify`]: host or device memory, with `cuPointerGetAttribute`
//!   (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE`; unregistered host memory makes
//!   the driver return an error, which means host).
//! * [`Stager`]: runs a collective or a send/recv group whose buffers are
//!   in device memory by staging them through cached pinned host buffers,
//!   ordered on a CUDA stream (NCCL's stream semantics; see its docs),
//!   pipelined in chunks: the copies of chunk k+1 and k-1 run on the
//!   stream while the network works on chunk k.
//! * Typed calls on cudarc's `CudaSlice` ([`Stager::all_reduce`] …).
//! * Reductions on the GPU (`dev_reduce.rs`, `stage_gpu.rs`): staged
//!   all-reduce, reduce-scatter and reduce move only bytes through the
//!   host (all-to-all, all-gather, gather) and reduce with kernels
//!   (`kernels.cu`) compiled at run time with NVRTC (`nvrtc.rs`),
//!   bit-identical to the host kernels. Every rank must pass device
//!   memory; the ranks agree on the path on the first such call.
//! * [`netreg`]: registering device buffers with the transport (DMA-BUF,
//!   peer memory) or staging them, by the transport's `ptr_support`.
//! * [`gdr`]: GPUDirect RDMA readiness: `NCCL_NET_GDR_LEVEL`, the DMA-BUF
//!   probe and file descriptor (`cuMemGetHandleForAddressRange`), and the
//!   INFO line that says whether staging or DMA-BUF would be used.
//!
//! # Environment
//! The `NCCL_RS_CUDA_*` variables, `NCCL_RS_NVRTC_LIBRARY`,
//! `NCCL_NET_GDR_LEVEL` and `NCCL_DMABUF_ENABLE` ([`crate::CudaConfig`]),
//! read once with the rest into [`crate::Config::global`]; see
//! `docs/configuration.md`.
//!
//! # Rules
//! Every rank of a call must use the same kind of memory when the
//! pipeline splits it (buffers larger than one chunk): a device-memory
//! rank runs the collective chunk by chunk, a host-memory rank in one
//! piece. NCCL itself requires device memory on every rank.

pub mod copy;
mod dev_reduce;
mod driver;
pub mod gdr;
mod kernels;
pub mod netreg;
mod nvrtc;
mod pointer;
mod stage;
mod streamop;
mod typed;

pub use cudarc;
pub use dev_reduce::DeviceReduce;
pub use pointer::{classify, MemKind};
pub use stage::{Stager, StagingOptions, Stream};
pub use streamop::{async_support, async_support_for, Gate, GateWait, HostFlag, ProxyStreams};

use driver::{api, check, CtxGuard};
use std::ffi::{c_char, c_int, c_void};

/// Why CUDA cannot be used, or a driver call that failed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// `NCCL_RS_CUDA_DISABLE` is set.
    #[error("CUDA is disabled (NCCL_RS_CUDA_DISABLE)")]
    Disabled,
    /// No driver library on this host.
    #[error(
        "the CUDA driver library (libcuda.so.1) was not found: no NVIDIA driver on this machine"
    )]
    NotFound,
    /// The driver lacks an entry point we need (too old).
    #[error("the CUDA driver has no {0} (driver too old)")]
    MissingSymbol(String),
    /// The driver is there but sees no device.
    #[error("the CUDA driver found no device")]
    NoDevice,
    /// A driver call failed.
    #[error("{call} failed: {name} ({code})")]
    Call {
        /// The driver function.
        call: &'static str,
        /// Its `CUresult`.
        code: i32,
        /// The driver's name for it.
        name: String,
    },
    /// Something this build or driver cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// Loading the driver panicked (a bug; reported, not propagated).
    #[error("loading the CUDA driver panicked: {0}")]
    Panicked(String),
}

impl CudaError {
    pub(crate) fn call(call: &'static str, code: c_int, api: Option<&driver::Api>) -> CudaError {
        CudaError::Call {
            call,
            code,
            name: driver::error_name(api, code),
        }
    }

    /// The driver's `CUresult`, for a failed call.
    pub fn code(&self) -> Option<i32> {
        match self {
            CudaError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// As a core error of `rank`: `Error::System` whose source is this
    /// `CudaError` (the C ABI maps it to `ncclUnhandledCudaError`).
    pub fn into_error(self, rank: usize) -> crate::Error {
        crate::Error::System {
            rank,
            what: "CUDA".into(),
            source: std::io::Error::other(self),
        }
    }

    /// The `CudaError` inside a core error made by [`into_error`](Self::into_error).
    pub fn of(e: &crate::Error) -> Option<&CudaError> {
        match e {
            crate::Error::System { source, .. } => source.get_ref()?.downcast_ref::<CudaError>(),
            _ => None,
        }
    }
}

/// One CUDA device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Device ordinal (as `cudaSetDevice` numbers them).
    pub ordinal: i32,
    /// Its name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Bytes of device memory.
    pub total_mem: usize,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// PCI address, `dddd:bb:dd.0`.
    pub pci_bus_id: String,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub gpudirect_rdma: bool,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
    pub dma_buf: bool,
}

/// The CUDA driver and its devices.
#[derive(Clone, Debug)]
pub struct CudaInfo {
    /// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
    pub driver_version: i32,
    /// The visible devices.
    pub devices: Vec<DeviceInfo>,
}

impl std::fmt::Display for CudaInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.driver_version;
        write!(
            f,
            "CUDA driver {}.{}, {} device(s)",
            v / 1000,
            (v % 1000) / 10,
            self.devices.len()
        )?;
        for d in &self.devices {
            write!(
                f,
                "; {}: {} (sm_{}{}, {} MiB, {}, GPUDirect RDMA {}, DMA-BUF {})",
                d.ordinal,
                d.name,
                d.compute_capability.0,
                d.compute_capability.1,
                d.total_mem >> 20,
                d.pci_bus_id,
                yes(d.gpudirect_rdma),
                yes(d.dma_buf)
            )?;
        }
        Ok(())
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// Loads the driver (once) and describes it and its devices. Without a
/// driver or a device this is an error, never a panic.
pub fn probe() -> Result<CudaInfo, CudaError> {
    let d = driver::driver()?;
    let api = &d.api;
    let mut devices = Vec::new();
    for ordinal in 0..d.devices {
        let mut dev = 0;
        // SAFETY: valid out-pointers and sizes throughout.
        unsafe {
            check(api, "cuDeviceGet", (api.cuDeviceGet)(&mut dev, ordinal))?;
            let mut name = [0 as c_char; 256];
            check(
                api,
                "cuDeviceGetName",
                (api.cuDeviceGetName)(name.as_mut_ptr(), name.len() as c_int - 1, dev),
            )?;
            let name = std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned();
            let mut total_mem = 0usize;
            check(
                api,
                "cuDeviceTotalMem",
                (api.cuDeviceTotalMem_v2)(&mut total_mem, dev),
            )?;
            let attr = |a: c_int| {
                let mut v = 0;
                ((api.cuDeviceGetAttribute)(&mut v, a, dev) == driver::SUCCESS).then_some(v)
            };
            use driver::dev_attr as A;
            devices.push(DeviceInfo {
                ordinal,
                name,
                total_mem,
                compute_capability: (
                    attr(A::COMPUTE_CAPABILITY_MAJOR).unwrap_or(0),
                    attr(A::COMPUTE_CAPABILITY_MINOR).unwrap_or(0),
                ),
                pci_bus_id: format!(
                    "{:04x}:{:02x}:{:02x}.0",
                    attr(A::PCI_DOMAIN_ID).unwrap_or(0),
                    attr(A::PCI_BUS_ID).unwrap_or(0),
                    attr(A::PCI_DEVICE_ID).unwrap_or(0)
                ),
                gpudirect_rdma: attr(A::GPU_DIRECT_RDMA_SUPPORTED).unwrap_or(0) != 0,
                dma_buf: attr(A::DMA_BUF_SUPPORTED).unwrap_or(0) != 0,
            });
            if attr(A::UNIFIED_ADDRESSING) == Some(0) {
                return Err(CudaError::Unsupported(format!(
                    "device {ordinal} lacks unified addressing, which pointer classification needs"
                )));
            }
        }
    }
    Ok(CudaInfo {
        driver_version: d.version,
        devices,
    })
}

/// Builds (once per context) the GPU reduction kernels for the current
/// context, or device 0's primary context when the thread has none, and
/// says how (NVRTC version, architecture), or why they cannot be used
/// (no NVRTC, no module support in the driver, ...). Staged reductions
/// take the host path in the second case unless `NCCL_RS_CUDA_REDUCE=gpu`.
pub fn device_reduce_probe() -> Result<String, CudaError> {
    let ctx = match driver::current_ctx() {
        Some(c) => c,
        None => driver::primary_ctx(0)?,
    };
    let _g = CtxGuard::bind(ctx)?;
    dev_reduce::kernels(ctx).map(|k| k.built.clone())
}

/// Whether a CUDA driver with at least one device is usable.
pub fn available() -> bool {
    driver::driver().is_ok()
}

/// The number of visible devices (`cuDeviceGetCount`).
pub fn device_count() -> Result<usize, CudaError> {
    driver::driver().map(|d| d.devices as usize)
}

/// The device of the calling thread's current context (what
/// `cudaGetDevice` reports once the thread used CUDA), if any.
pub fn current_device() -> Option<i32> {
    let api = api().ok()?;
    driver::current_ctx()?;
    let mut dev = 0;
    // SAFETY: valid out-pointer; a context is current.
    (unsafe { (api.cuCtxGetDevice)(&mut dev) } == driver::SUCCESS).then_some(dev)
}

/// Allocates `bytes` of device memory (`cuMemAlloc`) on the current
/// context's device, or on device 0 if the thread has no context.
pub fn device_alloc(bytes: usize) -> Result<*mut c_void, CudaError> {
    let api = api()?;
    let ctx = match driver::current_ctx() {
        Some(c) => c,
        None => driver::primary_ctx(0)?,
    };
    let _g = CtxGuard::bind(ctx)?;
    let mut p = 0;
    // SAFETY: valid out-pointer; a context is current.
    check(api, "cuMemAlloc", unsafe {
        (api.cuMemAlloc_v2)(&mut p, bytes)
    })?;
    Ok(p as *mut c_void)
}

/// Frees memory from [`device_alloc`].
///
/// # Safety
/// `p` came from [`device_alloc`], is freed once, and no stream work
/// still uses it.
pub unsafe fn device_free(p: *mut c_void) -> Result<(), CudaError> {
    let api = api()?;
    let info = pointer::info(p.cast());
    let ctx = match info.ctx {
        Some(c) => c,
        None => driver::primary_ctx(info.ordinal().unwrap_or(0))?,
    };
    let _g = CtxGuard::bind(ctx)?;
    // SAFETY: forwarded contract.
    check(api, "cuMemFree", unsafe { (api.cuMemFree_v2)(p as u64) })
}

/// Reads `bytes` at `ptr` (device or host memory) into a vector, ordered
/// after the work already on `stream` (it waits for the stream up to that
/// point). Used for `ncclScalarDevice` scalars.
///
/// # Safety
/// `ptr` must be valid for `bytes` bytes once `stream` reaches this point.
pub unsafe fn read_bytes(
    ptr: *const u8,
    bytes: usize,
    stream: Stream,
) -> Result<Vec<u8>, CudaError> {
    let info = pointer::info(ptr);
    if !info.is_device() {
        // SAFETY: host memory, readable (contract).
        return Ok(unsafe { std::slice::from_raw_parts(ptr, bytes) }.to_vec());
    }
    let ctx = stage::op_ctx(stream, &[info])?;
    let _g = CtxGuard::bind(ctx)?;
    let tmp = driver::Pinned::new(bytes)?;
    let ev = driver::Event::new()?;
    let s = stream.effective();
    // SAFETY: `tmp` outlives the copy (we wait for it below).
    unsafe { driver::copy_async(tmp.ptr(), ptr, bytes, s) }?;
    ev.record(s)?;
    ev.wait()?;
    // SAFETY: the copy finished; `tmp` holds `bytes` bytes.
    Ok(unsafe { std::slice::from_raw_parts(tmp.ptr(), bytes) }.to_vec())
}
