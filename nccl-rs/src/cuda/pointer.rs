//! Host or device memory? `cuPointerGetAttribute` decides.

use super::driver::{self, mem_type, ptr_attr, Ctx, CtxGuard};
use std::ffi::{c_int, c_uint, c_void};

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Host memory: pageable, pinned or registered. The CPU reads it
    /// directly; collectives take the ordinary path.
    Host,
    /// Device memory (or managed memory) of CUDA device `ordinal`: staged
    /// through pinned host buffers.
    Device {
        /// The device ordinal.
        ordinal: i32,
        /// Managed (unified) memory.
        managed: bool,
    },
}

/// A classified pointer and, for device memory, the context it belongs to
/// (`None`: no context attribute, e.g. VMM memory; the device's primary
/// context is used then).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PtrInfo {
    pub(crate) kind: MemKind,
    pub(crate) ctx: Option<Ctx>,
}

impl PtrInfo {
    pub(crate) const HOST: PtrInfo = PtrInfo {
        kind: MemKind::Host,
        ctx: None,
    };

    pub(crate) fn is_device(&self) -> bool {
        matches!(self.kind, MemKind::Device { .. })
    }

    pub(crate) fn ordinal(&self) -> Option<i32> {
        match self.kind {
            MemKind::Device { ordinal, .. } => Some(ordinal),
            MemKind::Host => None,
        }
    }
}

/// Host or device memory. Without CUDA (no driver, no device, or
/// `NCCL_RS_CUDA_DISABLE`) every pointer is host memory, and NULL always is.
/// Memory the driver does not know (pageable host memory) is host memory:
/// the driver answers `CUDA_ERROR_INVALID_VALUE` for it.
pub fn classify(ptr: *const c_void) -> MemKind {
    info(ptr.cast()).kind
}

/// [`classify`] with the context.
pub(crate) fn info(ptr: *const u8) -> PtrInfo {
    let Ok(api) = driver::api() else {
        return PtrInfo::HOST;
    };
    if ptr.is_null() {
        return PtrInfo::HOST;
    }
    let addr = ptr as u64;
    let get = |attr: c_int, out: *mut c_void| {
        // SAFETY: `out` points to storage of the attribute's type (an
        // unsigned int, an int or a CUcontext, as each caller passes).
        unsafe { (api.cuPointerGetAttribute)(out, attr, addr) }
    };
    let mut mt: c_uint = 0;
    let mut rc = get(ptr_attr::MEMORY_TYPE, (&mut mt as *mut c_uint).cast());
    if rc == driver::ERROR_INVALID_CONTEXT {
        // Some drivers want a current context even for this query.
        if let Ok(g) = driver::primary_ctx(0).and_then(CtxGuard::bind) {
            rc = get(ptr_attr::MEMORY_TYPE, (&mut mt as *mut c_uint).cast());
            drop(g);
        }
    }
    if rc != driver::SUCCESS || !(mt == mem_type::DEVICE || mt == mem_type::UNIFIED) {
        return PtrInfo::HOST;
    }
    let mut ordinal: c_int = 0;
    if get(
        ptr_attr::DEVICE_ORDINAL,
        (&mut ordinal as *mut c_int).cast(),
    ) != driver::SUCCESS
    {
        ordinal = 0;
    }
    let mut managed: c_uint = 0;
    let _ = get(ptr_attr::IS_MANAGED, (&mut managed as *mut c_uint).cast());
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let ctx = (get(ptr_attr::CONTEXT, (&mut ctx as *mut *mut c_void).cast()) == driver::SUCCESS
        && !ctx.is_null())
    .then_some(Ctx(ctx as usize));
    PtrInfo {
        kind: MemKind::Device {
            ordinal,
            managed: managed != 0 || mt == mem_type::UNIFIED,
        },
        ctx,
    }
}
