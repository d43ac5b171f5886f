//! GPUDirect RDMA readiness: may the NIC read and write device memory
//! directly, and how would it be registered?
//!
//! Two registrations exist: DMA-BUF (`cuMemGetHandleForAddressRange`
//! gives a file descriptor for a device range, which `ibv_reg_dmabuf_mr`
//! registers; the verbs transport's `MemRegion::DmaBuf`), and the
//! `nvidia-peermem` kernel module (plain `ibv_reg_mr` on the device
//! address). Support is probed, never assumed, and [`choose`] logs at INFO
//! which path a buffer takes: `dmabuf`, `peermem`, or `staging` (copies
//! through pinned host memory, always possible) with the reason.
//!
//! | variable | meaning |
//! |---|---|
//! | `NCCL_NET_GDR_LEVEL` | the farthest NIC↔GPU path that still uses GPUDirect: `LOC` (never), `PIX`, `PXB` (default), `PHB`, `SYS`, or NCCL's legacy integers 0–4 (larger is `SYS`) |
//! | `NCCL_DMABUF_ENABLE` | `0` forbids DMA-BUF registration (default `1`) |
//!
//! No topology detection exists yet: when the caller does not know the
//! NIC↔GPU distance, any level but `LOC` allows GPUDirect.

use super::driver;
use super::pointer;
use super::CudaError;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub use crate::config::GdrLevel;

/// The GPUDirect settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdrConfig {
    /// `NCCL_NET_GDR_LEVEL` (default `PXB`).
    pub level: GdrLevel,
    /// `NCCL_DMABUF_ENABLE` (default on).
    pub dmabuf: bool,
}

impl Default for GdrConfig {
    fn default() -> Self {
        GdrConfig {
            level: GdrLevel::Pxb,
            dmabuf: true,
        }
    }
}

impl GdrConfig {
    /// From the process environment ([`crate::Config::global`]).
    pub fn from_env() -> crate::Result<GdrConfig> {
        Ok(Self::from_config(crate::Config::global()?))
    }

    /// From `NCCL_NET_GDR_LEVEL` and `NCCL_DMABUF_ENABLE` of `c`.
    pub fn from_config(c: &crate::Config) -> GdrConfig {
        GdrConfig {
            level: c.cuda.gdr_level,
            dmabuf: c.cuda.dmabuf_enable,
        }
    }

    /// Through `get`, as [`crate::Config::from_lookup`] reads it (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> crate::Result<GdrConfig> {
        Ok(Self::from_config(&crate::Config::from_lookup(get)?))
    }
}

/// What this host supports for one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdrSupport {
    /// The device says GPUDirect RDMA works (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`).
    pub gpudirect_rdma: bool,
    /// DMA-BUF export works: the device attribute and the driver entry
    /// point `cuMemGetHandleForAddressRange` are both there.
    pub dmabuf: bool,
    /// The `nvidia-peermem` (or older `nv_peer_mem`) module is loaded.
    pub peermem: bool,
}

/// Probes device `ordinal`.
pub fn support(ordinal: i32) -> Result<GdrSupport, CudaError> {
    let info = super::probe()?;
    let d = info
        .devices
        .iter()
        .find(|d| d.ordinal == ordinal)
        .ok_or_else(|| CudaError::Unsupported(format!("no CUDA device {ordinal}")))?;
    let api = driver::api()?;
    Ok(GdrSupport {
        gpudirect_rdma: d.gpudirect_rdma,
        dmabuf: d.dma_buf && api.cuMemGetHandleForAddressRange.is_some(),
        peermem: peermem_loaded(),
    })
}

/// Whether the peer-memory kernel module is loaded.
pub fn peermem_loaded() -> bool {
    [
        "/sys/module/nvidia_peermem",
        "/sys/kernel/mm/memory_peers/nv_mem/version",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

/// A DMA-BUF file descriptor for a device range, as `ibv_reg_dmabuf_mr`
/// takes it: `len` bytes at `offset` in the exported range, which peers
/// address as `iova` (the device virtual address of the buffer). The
/// descriptor is closed on drop.
#[derive(Debug)]
pub struct DmaBuf {
    fd: OwnedFd,
    offset: u64,
    len: usize,
    iova: u64,
}

impl DmaBuf {
    /// The file descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Offset of the buffer in the exported range.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes of the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address peers use (`iova`).
    pub fn iova(&self) -> u64 {
        self.iova
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Exports `len` bytes of device memory at `ptr` as a DMA-BUF
/// (`cuMemGetHandleForAddressRange`, page-aligned around the buffer,
/// within its allocation).
///
/// # Safety
/// `ptr..ptr+len` must be device memory that stays allocated while the
/// descriptor (or a registration made from it) is in use.
pub unsafe fn dmabuf_for(ptr: *const c_void, len: usize) -> Result<DmaBuf, CudaError> {
    let api = driver::api()?;
    let f = api.cuMemGetHandleForAddressRange.ok_or_else(|| {
        CudaError::MissingSymbol(
            "cuMemGetHandleForAddressRange (DMA-BUF export, CUDA 11.7+)".into(),
        )
    })?;
    let info = pointer::info(ptr.cast());
    let Some(ordinal) = info.ordinal() else {
        return Err(CudaError::Unsupported(format!(
            "{ptr:?} is not device memory"
        )));
    };
    let ctx = match info.ctx {
        Some(c) => c,
        None => driver::primary_ctx(ordinal)?,
    };
    let _g = driver::CtxGuard::bind(ctx)?;
    let page = page_size();
    let addr = ptr as u64;
    let mut base = addr & !(page - 1);
    let mut end = (addr + len as u64).next_multiple_of(page);
    // Stay inside the allocation (CU_POINTER_ATTRIBUTE_RANGE_START_ADDR /
    // RANGE_SIZE = 11 / 12).
    let (mut start, mut size): (u64, usize) = (0, 0);
    // SAFETY: valid out-pointers of the attributes' types.
    unsafe {
        if (api.cuPointerGetAttribute)((&mut start as *mut u64).cast(), 11, addr) == driver::SUCCESS
            && (api.cuPointerGetAttribute)((&mut size as *mut usize).cast(), 12, addr)
                == driver::SUCCESS
            && size > 0
        {
            base = base.max(start);
            end = end.min(start + size as u64);
        }
    }
    let mut fd: c_int = -1;
    // SAFETY: `fd` receives an int (DMA_BUF_FD handle type); the range is
    // device memory of the current context (contract).
    let rc = unsafe {
        f(
            (&mut fd as *mut c_int).cast(),
            base,
            (end - base) as usize,
            driver::MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    driver::check(api, "cuMemGetHandleForAddressRange", rc)?;
    if fd < 0 {
        return Err(CudaError::Unsupported(
            "cuMemGetHandleForAddressRange returned no descriptor".into(),
        ));
    }
    Ok(DmaBuf {
        // SAFETY: a fresh descriptor the driver handed to us.
        fd: unsafe { OwnedFd::from_raw_fd(fd) },
        offset: addr - base,
        len,
        iova: addr,
    })
}

/// How a buffer would travel through an RDMA NIC.
#[derive(Debug)]
pub enum DataPath {
    /// Host memory: registered as it is.
    Host,
    /// Device memory staged through pinned host buffers.
    Staging {
        /// Why GPUDirect is not used.
        reason: String,
    },
    /// Device memory registered through this DMA-BUF.
    DmaBuf(DmaBuf),
    /// Device memory registered by address (`nvidia-peermem`).
    PeerMem,
}

impl DataPath {
    /// `host`, `staging`, `dmabuf` or `peermem`.
    pub fn name(&self) -> &'static str {
        match self {
            DataPath::Host => "host",
            DataPath::Staging { .. } => "staging",
            DataPath::DmaBuf(_) => "dmabuf",
            DataPath::PeerMem => "peermem",
        }
    }
}

/// Decides (and logs at INFO) the path of `len` bytes at `ptr` through
/// the network: `rdma_nic` says whether the transport is an RDMA NIC at
/// all (TCP sockets always stage), `distance` is the NIC↔GPU path if
/// known.
///
/// # Safety
/// As [`dmabuf_for`] when `ptr` is device memory.
pub unsafe fn choose(
    ptr: *const c_void,
    len: usize,
    cfg: &GdrConfig,
    rdma_nic: bool,
    distance: Option<GdrLevel>,
) -> DataPath {
    let info = pointer::info(ptr.cast());
    let Some(ordinal) = info.ordinal() else {
        return DataPath::Host;
    };
    let staging = |reason: String| DataPath::Staging { reason };
    let path = 'path: {
        if !rdma_nic {
            break 'path staging("the network transport is TCP sockets, not an RDMA NIC".into());
        }
        if cfg.level == GdrLevel::Loc {
            break 'path staging("NCCL_NET_GDR_LEVEL=LOC".into());
        }
        if let Some(d) = distance.filter(|d| *d > cfg.level) {
            break 'path staging(format!(
                "NIC at distance {d}, beyond NCCL_NET_GDR_LEVEL={}",
                cfg.level
            ));
        }
        let sup = match support(ordinal) {
            Ok(s) => s,
            Err(e) => break 'path staging(format!("probing device {ordinal} failed: {e}")),
        };
        let mut why = Vec::new();
        if !sup.gpudirect_rdma {
            why.push(format!("device {ordinal} does not support GPUDirect RDMA"));
        }
        match (sup.dmabuf, cfg.dmabuf) {
            (true, true) => {
                // SAFETY: forwarded contract.
                match unsafe { dmabuf_for(ptr, len) } {
                    Ok(d) => break 'path DataPath::DmaBuf(d),
                    Err(e) => why.push(format!("DMA-BUF export failed: {e}")),
                }
            }
            (false, _) => why.push("no DMA-BUF support in the driver or device".into()),
            (true, false) => why.push("NCCL_DMABUF_ENABLE=0".into()),
        }
        if sup.peermem && sup.gpudirect_rdma {
            break 'path DataPath::PeerMem;
        }
        why.push("nvidia-peermem is not loaded".into());
        staging(why.join("; "))
    };
    match &path {
        DataPath::Staging { reason } => tracing::info!(
            "GPUDirect RDMA: staging {len} bytes of device {ordinal} at {ptr:?} through pinned host memory ({reason})"
        ),
        DataPath::DmaBuf(d) => tracing::info!(
            "GPUDirect RDMA: dmabuf fd {} (offset {}, iova {:#x}) for {len} bytes of device {ordinal}",
            d.fd(),
            d.offset(),
            d.iova()
        ),
        p => tracing::info!("GPUDirect RDMA: {} for {len} bytes of device {ordinal} at {ptr:?}", p.name()),
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_like_nccl() {
        assert_eq!(GdrLevel::parse("loc"), Some(GdrLevel::Loc));
        assert_eq!(GdrLevel::parse(" PHB "), Some(GdrLevel::Phb));
        assert_eq!(GdrLevel::parse("2"), Some(GdrLevel::Pxb));
        assert_eq!(GdrLevel::parse("9"), Some(GdrLevel::Sys));
        assert_eq!(GdrLevel::parse("near"), None);
        assert!(GdrLevel::Pix < GdrLevel::Sys);
    }

    #[test]
    fn config_from_lookup() {
        let none = GdrConfig::from_lookup(|_| None).unwrap();
        assert_eq!(none, GdrConfig::default());
        let c = GdrConfig::from_lookup(|k| match k {
            "NCCL_NET_GDR_LEVEL" => Some("SYS".into()),
            "NCCL_DMABUF_ENABLE" => Some("0".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((c.level, c.dmabuf), (GdrLevel::Sys, false));
        assert!(
            GdrConfig::from_lookup(|k| (k == "NCCL_NET_GDR_LEVEL").then(|| "x".into())).is_err()
        );
        assert!(
            GdrConfig::from_lookup(|k| (k == "NCCL_DMABUF_ENABLE").then(|| "2".into())).is_err()
        );
    }

    #[test]
    fn host_memory_takes_the_host_path() {
        let v = [0u8; 64];
        // SAFETY: host memory: nothing is exported.
        let p = unsafe { choose(v.as_ptr().cast(), 64, &GdrConfig::default(), true, None) };
        assert!(matches!(p, DataPath::Host), "{p:?}");
    }
}
