//! Owned verbs resources, in rust-ibverbs' style: each handle wraps an
//! `Arc<…Inner>`, each child holds its parent's `Arc`, and `Drop` destroys
//! in dependency order (a QP before its CQ and PD, an MR before its PD,
//! everything before the device context). `as_raw()` gives the C pointer.
//!
//! # Teardown failures
//! A failing `ibv_destroy_*` / `ibv_dereg_mr` / `ibv_close_device` means a
//! bug in our ownership (e.g. a CQ still used by a QP): debug builds panic;
//! release builds log an error and leak the kernel object until process
//! exit, since this library may run inside a C host (through the FFI) where
//! a panic in `Drop` would abort the process.

use crate::error::VerbsError;
use crate::sys::{self, Lib};
use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

fn teardown_failed(what: &str, name: &str, rc: i32) {
    let msg = format!(
        "NET/IB: {what} failed on {name} (rc {rc}, errno {})",
        std::io::Error::last_os_error()
    );
    debug_assert!(false, "{msg}");
    tracing::error!("{msg}; leaking the object");
}

/// An open device (`struct ibv_context`).
pub(crate) struct ContextInner {
    pub(crate) lib: &'static Lib,
    ctx: NonNull<sys::ibv_context>,
    /// Device name, e.g. `rxe0`.
    pub(crate) name: String,
}

// SAFETY: libibverbs objects are thread-safe (rdma-core documents every verb
// as callable from any thread); we only hand the pointer to the library.
unsafe impl Send for ContextInner {}
// SAFETY: as above: shared use only passes the pointer to thread-safe verbs.
unsafe impl Sync for ContextInner {}

impl ContextInner {
    /// A context of a test library whose verbs never dereference it.
    #[cfg(test)]
    pub(crate) fn stub(lib: &'static Lib, name: &str) -> Arc<ContextInner> {
        Arc::new(ContextInner {
            lib,
            ctx: NonNull::dangling(),
            name: name.to_owned(),
        })
    }

    pub(crate) fn as_raw(&self) -> *mut sys::ibv_context {
        self.ctx.as_ptr()
    }

    /// `ibv_query_device`.
    pub(crate) fn query_device(&self) -> Result<sys::ibv_device_attr, VerbsError> {
        let mut attr = sys::ibv_device_attr::default();
        // SAFETY: live context; `attr` is a complete, writable struct.
        let rc = unsafe { (self.lib.query_device)(self.as_raw(), &mut attr) };
        if rc != 0 {
            return Err(VerbsError::verb("ibv_query_device", &self.name, rc));
        }
        Ok(attr)
    }

    /// `ibv_query_port` (the exported symbol; see [`crate::sys`]).
    pub(crate) fn query_port(&self, port: u8) -> Result<sys::ibv_port_attr, VerbsError> {
        let mut buf = sys::PortAttrBuf::default();
        // SAFETY: live context; `buf` is zeroed and larger than any version
        // of `struct ibv_port_attr`.
        let rc = unsafe { (self.lib.query_port)(self.as_raw(), port, &mut buf) };
        if rc != 0 {
            return Err(VerbsError::verb("ibv_query_port", &self.name, rc));
        }
        Ok(buf.attr)
    }

    /// `ibv_query_gid`.
    pub(crate) fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16], VerbsError> {
        let mut gid = sys::ibv_gid::default();
        let idx = i32::try_from(index).unwrap_or(i32::MAX);
        // SAFETY: live context; `gid` is a writable 16-byte union.
        let rc = unsafe { (self.lib.query_gid)(self.as_raw(), port, idx, &mut gid) };
        if rc != 0 {
            return Err(VerbsError::verb("ibv_query_gid", &self.name, rc));
        }
        Ok(gid.raw)
    }
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: we own the context; every child holds an Arc to us, so
        // none is left when this runs.
        let rc = unsafe { (self.lib.close_device)(self.as_raw()) };
        if rc != 0 {
            teardown_failed("ibv_close_device", &self.name, rc);
        }
    }
}

/// Names of the RDMA devices present (`ibv_get_device_list`), or the errno
/// the list failed with (ENOSYS when the kernel has no RDMA support).
pub(crate) fn device_names(lib: &'static Lib) -> Result<Vec<String>, VerbsError> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-parameter.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        return Err(VerbsError::verb("ibv_get_device_list", "-", 0));
    }
    let names = (0..usize::try_from(n).unwrap_or(0))
        .map(|i| {
            // SAFETY: `list` holds `n` valid device pointers; the name is a
            // NUL-terminated string owned by the device.
            unsafe { CStr::from_ptr((lib.get_device_name)(*list.add(i))) }
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { (lib.free_device_list)(list) };
    Ok(names)
}

/// Opens the device called `name`.
pub(crate) fn open_device(lib: &'static Lib, name: &str) -> Result<Arc<ContextInner>, VerbsError> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-parameter.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        return Err(VerbsError::verb("ibv_get_device_list", name, 0));
    }
    let mut ctx = std::ptr::null_mut();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: as in `device_names`.
        let dev = unsafe { *list.add(i) };
        // SAFETY: as in `device_names`.
        let dev_name = unsafe { CStr::from_ptr((lib.get_device_name)(dev)) };
        if dev_name.to_bytes() == name.as_bytes() {
            // SAFETY: `dev` is valid until the list is freed; the opened
            // context stays valid after that (libibverbs keeps a reference).
            ctx = unsafe { (lib.open_device)(dev) };
            if ctx.is_null() {
                let e = VerbsError::verb("ibv_open_device", name, 0);
                // SAFETY: freed once.
                unsafe { (lib.free_device_list)(list) };
                return Err(e);
            }
            break;
        }
    }
    // SAFETY: freed once.
    unsafe { (lib.free_device_list)(list) };
    let ctx =
        NonNull::new(ctx).ok_or_else(|| VerbsError::NoDevice(format!("device {name} vanished")))?;
    Ok(Arc::new(ContextInner {
        lib,
        ctx,
        name: name.to_owned(),
    }))
}

/// A protection domain.
pub(crate) struct PdInner {
    pub(crate) ctx: Arc<ContextInner>,
    pd: NonNull<sys::ibv_pd>,
}

// SAFETY: see ContextInner.
unsafe impl Send for PdInner {}
// SAFETY: see ContextInner.
unsafe impl Sync for PdInner {}

impl PdInner {
    /// `ibv_alloc_pd`.
    pub(crate) fn new(ctx: &Arc<ContextInner>) -> Result<Arc<PdInner>, VerbsError> {
        // SAFETY: live context.
        let pd = unsafe { (ctx.lib.alloc_pd)(ctx.as_raw()) };
        let pd = NonNull::new(pd).ok_or_else(|| VerbsError::verb("ibv_alloc_pd", &ctx.name, 0))?;
        Ok(Arc::new(PdInner {
            ctx: Arc::clone(ctx),
            pd,
        }))
    }

    /// A PD of a test library (see [`ContextInner::stub`]).
    #[cfg(test)]
    pub(crate) fn stub(ctx: &Arc<ContextInner>) -> Arc<PdInner> {
        Arc::new(PdInner {
            ctx: Arc::clone(ctx),
            pd: NonNull::dangling(),
        })
    }

    pub(crate) fn as_raw(&self) -> *mut sys::ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs hold Arcs to us, so none is left.
        let rc = unsafe { (self.ctx.lib.dealloc_pd)(self.as_raw()) };
        if rc != 0 {
            teardown_failed("ibv_dealloc_pd", &self.ctx.name, rc);
        }
    }
}

/// A completion queue.
pub(crate) struct CqInner {
    pub(crate) ctx: Arc<ContextInner>,
    cq: NonNull<sys::ibv_cq>,
}

// SAFETY: see ContextInner.
unsafe impl Send for CqInner {}
// SAFETY: see ContextInner.
unsafe impl Sync for CqInner {}

impl CqInner {
    /// `ibv_create_cq` with `depth` entries, no completion channel.
    pub(crate) fn new(ctx: &Arc<ContextInner>, depth: usize) -> Result<Arc<CqInner>, VerbsError> {
        let depth = i32::try_from(depth).unwrap_or(i32::MAX);
        // SAFETY: live context; null channel and context are allowed.
        let cq = unsafe {
            (ctx.lib.create_cq)(
                ctx.as_raw(),
                depth,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| VerbsError::verb("ibv_create_cq", &ctx.name, 0))?;
        Ok(Arc::new(CqInner {
            ctx: Arc::clone(ctx),
            cq,
        }))
    }

    pub(crate) fn as_raw(&self) -> *mut sys::ibv_cq {
        self.cq.as_ptr()
    }

    /// Polls up to `wc.len()` completions; returns how many were filled.
    pub(crate) fn poll(&self, wc: &mut [sys::ibv_wc]) -> Result<usize, VerbsError> {
        let n = i32::try_from(wc.len()).unwrap_or(i32::MAX);
        // SAFETY: live CQ; `wc` has room for `n` entries.
        let got = unsafe { sys::poll_cq(self.as_raw(), n, wc.as_mut_ptr()) };
        usize::try_from(got).map_err(|_| VerbsError::verb("ibv_poll_cq", &self.ctx.name, -got))
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: QPs using this CQ hold Arcs to us, so none is left.
        let rc = unsafe { (self.ctx.lib.destroy_cq)(self.as_raw()) };
        if rc != 0 {
            teardown_failed("ibv_destroy_cq", &self.ctx.name, rc);
        }
    }
}

/// Access for memory that only we read (send side): no remote access.
pub(crate) const ACCESS_LOCAL_READ: i32 = 0;
/// Access for memory peers write into (receive side, FIFOs).
pub(crate) const ACCESS_REMOTE_WRITE: i32 =
    sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ;

/// Memory to register: host virtual memory, or an external region such as
/// a DMA-BUF exported by CUDA (GPUDirect RDMA, for the `cuda` feature).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemRegion {
    /// `len` bytes of process memory at `addr`.
    Host { addr: usize, len: usize },
    /// `len` bytes at `offset` of DMA-BUF `fd`, addressed by peers as
    /// `iova`.
    DmaBuf {
        fd: i32,
        offset: u64,
        len: usize,
        iova: u64,
    },
}

/// A registered memory region. Does not own the memory.
pub(crate) struct Mr {
    pd: Arc<PdInner>,
    mr: NonNull<sys::ibv_mr>,
}

// SAFETY: see ContextInner.
unsafe impl Send for Mr {}
// SAFETY: see ContextInner.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mr(lkey {:#x}, rkey {:#x})", self.lkey(), self.rkey())
    }
}

impl Mr {
    /// `ibv_reg_mr` of `len` bytes at `addr`.
    ///
    /// # Safety
    /// `addr..addr+len` must be mapped memory (writable if `access` asks
    /// for local or remote write) that stays mapped until this `Mr` is
    /// dropped; the device may access it until then.
    pub(crate) unsafe fn register(
        pd: &Arc<PdInner>,
        addr: *mut u8,
        len: usize,
        access: i32,
    ) -> Result<Mr, VerbsError> {
        let lib = pd.ctx.lib;
        // SAFETY: live PD; the caller guarantees the range.
        let mr = unsafe { (lib.reg_mr)(pd.as_raw(), addr.cast(), len, access) };
        let mr = NonNull::new(mr).ok_or_else(|| VerbsError::verb("ibv_reg_mr", &pd.ctx.name, 0))?;
        Ok(Mr {
            pd: Arc::clone(pd),
            mr,
        })
    }

    /// Registers `region` (`ibv_reg_mr` or `ibv_reg_dmabuf_mr`).
    ///
    /// # Safety
    /// As [`Mr::register`] for host memory and [`Mr::register_dmabuf`] for
    /// DMA-BUF regions.
    pub(crate) unsafe fn register_region(
        pd: &Arc<PdInner>,
        region: MemRegion,
        access: i32,
    ) -> Result<Mr, VerbsError> {
        match region {
            // SAFETY: forwarded from the caller.
            MemRegion::Host { addr, len } => unsafe {
                Mr::register(pd, addr as *mut u8, len, access)
            },
            MemRegion::DmaBuf {
                fd,
                offset,
                len,
                iova,
            } => {
                // SAFETY: forwarded from the caller.
                unsafe { Mr::register_dmabuf(pd, fd, offset, len, iova, access) }
            }
        }
    }

    /// `ibv_reg_dmabuf_mr` of `len` bytes at `offset` of DMA-BUF `fd`,
    /// addressed by the peer as `iova`.
    ///
    /// # Safety
    /// `fd` must be a DMA-BUF file descriptor whose range stays valid until
    /// this `Mr` is dropped.
    pub(crate) unsafe fn register_dmabuf(
        pd: &Arc<PdInner>,
        fd: i32,
        offset: u64,
        len: usize,
        iova: u64,
        access: i32,
    ) -> Result<Mr, VerbsError> {
        let Some(f) = pd.ctx.lib.reg_dmabuf_mr else {
            return Err(VerbsError::Verb {
                call: "ibv_reg_dmabuf_mr",
                device: pd.ctx.name.clone(),
                source: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            });
        };
        // SAFETY: live PD; the caller guarantees the DMA-BUF range.
        let mr = unsafe { f(pd.as_raw(), offset, len, iova, fd, access) };
        let mr = NonNull::new(mr)
            .ok_or_else(|| VerbsError::verb("ibv_reg_dmabuf_mr", &pd.ctx.name, 0))?;
        Ok(Mr {
            pd: Arc::clone(pd),
            mr,
        })
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is live while self is.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: we own the registration; requests using it hold a
        // reference (registration cache) until they complete.
        let rc = unsafe { (self.pd.ctx.lib.dereg_mr)(self.mr.as_ptr()) };
        if rc != 0 {
            teardown_failed("ibv_dereg_mr", &self.pd.ctx.name, rc);
        }
    }
}

/// Whether the device can register DMA-BUF memory, probed as NCCL does: a
/// registration with fd -1 fails with `EOPNOTSUPP`/`EPROTONOSUPPORT` when
/// the kernel or provider lacks support, and with `EBADF` otherwise.
pub(crate) fn probe_dmabuf(pd: &Arc<PdInner>) -> bool {
    let Some(f) = pd.ctx.lib.reg_dmabuf_mr else {
        return false;
    };
    // SAFETY: fd -1 with an empty range never maps anything; a non-null
    // result (not expected) is released at once.
    let mr = unsafe { f(pd.as_raw(), 0, 0, 0, -1, 0) };
    if !mr.is_null() {
        // SAFETY: we own the unexpected registration.
        unsafe { (pd.ctx.lib.dereg_mr)(mr) };
        return true;
    }
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    !matches!(
        errno,
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS
    )
}

/// Page-aligned, zeroed memory registered as one MR per protection domain
/// (one per rail); the MRs are released before the memory.
pub(crate) struct RegisteredBuf {
    /// One per PD given to `new_on`, in that order; never empty until Drop.
    mrs: Vec<Mr>,
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain memory owned by this value; see ContextInner
// for the MR.
unsafe impl Send for RegisteredBuf {}

impl RegisteredBuf {
    /// Allocates `len` bytes and registers them with every PD in `pds`
    /// (at least one).
    pub(crate) fn new_on(
        pds: &[Arc<PdInner>],
        len: usize,
        access: i32,
    ) -> Result<RegisteredBuf, VerbsError> {
        let Some(pd0) = pds.first() else {
            return Err(VerbsError::verb("ibv_reg_mr", "no device", libc::EINVAL));
        };
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| VerbsError::verb("alloc", &format!("{e}"), libc::ENOMEM))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| VerbsError::verb("alloc", &pd0.ctx.name, libc::ENOMEM))?;
        let mut mrs = Vec::with_capacity(pds.len());
        for pd in pds {
            // SAFETY: the memory is ours, writable, and outlives the MR
            // (dropped first in Drop, or below on failure).
            match unsafe { Mr::register(pd, ptr.as_ptr(), len, access) } {
                Ok(mr) => mrs.push(mr),
                Err(e) => {
                    drop(mrs);
                    // SAFETY: allocated above with this layout; no MR is left.
                    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
                    return Err(e);
                }
            }
        }
        Ok(RegisteredBuf { mrs, ptr, layout })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The first PD's registration.
    pub(crate) fn mr(&self) -> &Mr {
        &self.mrs[0]
    }

    /// The registration with the `i`-th PD given to `new_on` (the first if
    /// out of range).
    pub(crate) fn mr_on(&self, i: usize) -> &Mr {
        self.mrs.get(i).unwrap_or(&self.mrs[0])
    }
}

impl Drop for RegisteredBuf {
    fn drop(&mut self) {
        self.mrs.clear();
        // SAFETY: allocated in `new` with this layout; the MR is gone.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
