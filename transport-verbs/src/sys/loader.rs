//! Loading libibverbs with `dlopen` and resolving its exported symbols.

use super::types::{
    ibv_context, ibv_cq, ibv_device, ibv_device_attr, ibv_gid, ibv_mr, ibv_opaque, ibv_pd,
    ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
};
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// The soname NCCL and rdma-core use.
pub(crate) const LIBIBVERBS: &str = "libibverbs.so.1";

/// Buffer handed to `ibv_query_port`: the full struct plus slack, so a
/// library newer than our declaration cannot write past it.
#[repr(C)]
#[derive(Default)]
pub(crate) struct PortAttrBuf {
    pub(crate) attr: ibv_port_attr,
    _slack: [u64; 8],
}

/// Resolved entry points of libibverbs. The library stays loaded for the
/// life of the process (it lives in a `static`), so the function pointers
/// stay valid.
pub(crate) struct Lib {
    pub(crate) _lib: libloading::Library,
    pub(crate) get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub(crate) free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub(crate) get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub(crate) open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub(crate) close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub(crate) query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub(crate) query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut PortAttrBuf) -> c_int,
    pub(crate) query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub(crate) alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub(crate) dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub(crate) reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    /// `ibv_reg_dmabuf_mr` (rdma-core 34+); `None` on older libraries.
    pub(crate) reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    pub(crate) dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub(crate) create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_opaque,
        c_int,
    ) -> *mut ibv_cq,
    pub(crate) destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub(crate) create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub(crate) modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub(crate) destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lib").finish_non_exhaustive()
    }
}

/// Why libibverbs could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LoadError {
    /// `dlopen` failed (rdma-core not installed).
    Open(String),
    /// A required symbol is missing (library too old).
    Symbol(&'static str, String),
}

impl Lib {
    /// Opens `name` with `dlopen` and resolves every entry point.
    pub(crate) fn load(name: &str) -> Result<Lib, LoadError> {
        // SAFETY: loading libibverbs runs its ELF constructors, which only
        // initialise the library's own state; we pass a plain soname.
        let lib = unsafe { libloading::Library::new(name) }
            .map_err(|e| LoadError::Open(e.to_string()))?;
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the declared type matches the C prototype in
                // rdma-core's verbs.h (ABI IBVERBS_1.1); the pointer is
                // copied out and stays valid while `lib` is loaded, which is
                // as long as this `Lib` lives.
                match unsafe { lib.get(concat!($name, "\0").as_bytes()) } {
                    Ok(s) => *s,
                    Err(e) => return Err(LoadError::Symbol($name, e.to_string())),
                }
            }};
        }
        // SAFETY: as in `sym!`; an absent optional symbol yields `None`.
        let reg_dmabuf_mr = unsafe { lib.get(b"ibv_reg_dmabuf_mr\0") }.ok().map(|s| *s);
        Ok(Lib {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_device: sym!("ibv_query_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            reg_dmabuf_mr,
            dereg_mr: sym!("ibv_dereg_mr"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            _lib: lib,
        })
    }

    /// The process-wide library, loaded on first use.
    pub(crate) fn get() -> Result<&'static Lib, LoadError> {
        static LIB: OnceLock<Result<Lib, LoadError>> = OnceLock::new();
        LIB.get_or_init(|| Lib::load(LIBIBVERBS))
            .as_ref()
            .map_err(Clone::clone)
    }
}
