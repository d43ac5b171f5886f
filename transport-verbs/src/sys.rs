//! The few libibverbs types and functions this crate uses, loaded at run
//! time with `dlopen("libibverbs.so.1")`.
//!
//! # Why our own binding
//! NCCL loads libibverbs with `dlopen` (its `ibvwrap.cc` / `ibvsymbols.cc`),
//! so one NCCL build runs on machines with and without rdma-core and falls
//! back to sockets. The Rust crates that bind libibverbs do not allow that:
//! `rdma-sys` and `ibverbs-sys` (under `ibverbs`) emit
//! `cargo:rustc-link-lib=ibverbs`, so the binary gets a `DT_NEEDED` entry for
//! `libibverbs.so.1` and does not even start where rdma-core is missing (and
//! `ibverbs-sys` builds a vendored rdma-core with cmake at build time). We
//! need about fifteen functions and a dozen structs, so this module declares
//! them by hand from rdma-core's `infiniband/verbs.h` (ABI `IBVERBS_1.1`,
//! stable since rdma-core v13) and resolves the symbols with `libloading`.
//! The structs only declare the prefix of fields we touch where the C struct
//! is longer and is never allocated by us (`ibv_context`, `ibv_qp`,
//! `ibv_cq`, `ibv_pd`); structs we allocate and pass in are complete. The
//! unit tests pin every size and offset we rely on to the values printed by
//! a C program compiled against rdma-core 44's header (x86_64 and aarch64
//! share them: LP64, natural alignment).
//!
//! # Inline functions
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are `static inline` in
//! `verbs.h`: they call through the provider's function table in
//! `context->ops`, found from the QP's or CQ's `context` pointer. There are
//! no symbols for them, so [`post_send`], [`post_recv`] and [`poll_cq`] do
//! the same through [`ibv_context_ops`].
//!
//! `ibv_query_port` is a macro in newer headers that prefers the extended
//! `verbs_context` op and otherwise calls the exported `ibv_query_port`
//! symbol with a zeroed `struct ibv_port_attr` cast to the older
//! `_compat_ibv_port_attr`. We call the exported symbol the same way (as NCCL
//! does), with a zeroed buffer larger than any version of the struct.
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

/// The soname NCCL and rdma-core use.
pub(crate) const LIBIBVERBS: &str = "libibverbs.so.1";

/// Opaque `struct ibv_device`.
#[repr(C)]
pub(crate) struct ibv_device {
    _private: [u8; 0],
}

/// Opaque `struct ibv_comp_channel`, `ibv_srq`.
#[repr(C)]
pub(crate) struct ibv_opaque {
    _private: [u8; 0],
}

pub(crate) type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub(crate) type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub(crate) type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_context_ops`: 32 pointers, of which we call three.
#[repr(C)]
pub(crate) struct ibv_context_ops {
    _before_poll_cq: [*mut c_void; 11],
    pub(crate) poll_cq: Option<PollCqFn>,
    _before_post_send: [*mut c_void; 13],
    pub(crate) post_send: Option<PostSendFn>,
    pub(crate) post_recv: Option<PostRecvFn>,
    _after: [*mut c_void; 5],
}

/// `struct ibv_context`, up to the fields we read (the mutex and
/// `abi_compat` follow; the provider allocates the whole thing).
#[repr(C)]
pub(crate) struct ibv_context {
    pub(crate) device: *mut ibv_device,
    pub(crate) ops: ibv_context_ops,
    pub(crate) cmd_fd: c_int,
    pub(crate) async_fd: c_int,
    pub(crate) num_comp_vectors: c_int,
}

/// `struct ibv_pd` (prefix).
#[repr(C)]
pub(crate) struct ibv_pd {
    pub(crate) context: *mut ibv_context,
    pub(crate) handle: u32,
}

/// `struct ibv_cq` (prefix).
#[repr(C)]
pub(crate) struct ibv_cq {
    pub(crate) context: *mut ibv_context,
    pub(crate) channel: *mut ibv_opaque,
    pub(crate) cq_context: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) cqe: c_int,
}

/// `struct ibv_qp` (prefix).
#[repr(C)]
pub(crate) struct ibv_qp {
    pub(crate) context: *mut ibv_context,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut ibv_opaque,
    pub(crate) handle: u32,
    pub(crate) qp_num: u32,
    pub(crate) state: c_uint,
    pub(crate) qp_type: c_uint,
}

/// `struct ibv_mr` (complete).
#[repr(C)]
pub(crate) struct ibv_mr {
    pub(crate) context: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) addr: *mut c_void,
    pub(crate) length: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// `struct ibv_port_attr` (complete, rdma-core 44).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_port_attr {
    pub(crate) state: c_uint,
    pub(crate) max_mtu: c_uint,
    pub(crate) active_mtu: c_uint,
    pub(crate) gid_tbl_len: c_int,
    pub(crate) port_cap_flags: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) bad_pkey_cntr: u32,
    pub(crate) qkey_viol_cntr: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) max_vl_num: u8,
    pub(crate) sm_sl: u8,
    pub(crate) subnet_timeout: u8,
    pub(crate) init_type_reply: u8,
    pub(crate) active_width: u8,
    pub(crate) active_speed: u8,
    pub(crate) phys_state: u8,
    pub(crate) link_layer: u8,
    pub(crate) flags: u8,
    pub(crate) port_cap_flags2: u16,
}

/// `struct ibv_device_attr` (complete).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_device_attr {
    pub(crate) fw_ver: [c_char; 64],
    pub(crate) node_guid: u64,
    pub(crate) sys_image_guid: u64,
    pub(crate) max_mr_size: u64,
    pub(crate) page_size_cap: u64,
    pub(crate) vendor_id: u32,
    pub(crate) vendor_part_id: u32,
    pub(crate) hw_ver: u32,
    pub(crate) max_qp: c_int,
    pub(crate) max_qp_wr: c_int,
    pub(crate) device_cap_flags: c_uint,
    pub(crate) max_sge: c_int,
    pub(crate) max_sge_rd: c_int,
    pub(crate) max_cq: c_int,
    pub(crate) max_cqe: c_int,
    pub(crate) max_mr: c_int,
    pub(crate) max_pd: c_int,
    pub(crate) max_qp_rd_atom: c_int,
    pub(crate) max_ee_rd_atom: c_int,
    pub(crate) max_res_rd_atom: c_int,
    pub(crate) max_qp_init_rd_atom: c_int,
    pub(crate) max_ee_init_rd_atom: c_int,
    pub(crate) atomic_cap: c_uint,
    _more_limits: [c_int; 14],
    pub(crate) max_pkeys: u16,
    pub(crate) local_ca_ack_delay: u8,
    pub(crate) phys_port_cnt: u8,
}

impl Default for ibv_device_attr {
    fn default() -> Self {
        // SAFETY: all-zero bytes are a valid value of this plain C struct
        // (integers and a char array).
        unsafe { std::mem::zeroed() }
    }
}

/// `union ibv_gid`: 16 raw bytes, 8-byte aligned (the union's other
/// member is two `__be64`s, which makes `ibv_global_route`, `ibv_ah_attr`
/// and `ibv_qp_attr` 8-byte aligned too).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ibv_gid {
    pub(crate) raw: [u8; 16],
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr` (the `wr` union is 32 bytes: its
/// largest member is `atomic`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_rdma_wr {
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) _pad: u32,
    pub(crate) _rest_of_union: [u64; 2],
}

/// `struct ibv_send_wr` (complete; unions we never use are padding).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_send_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_send_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: c_uint,
    pub(crate) send_flags: c_uint,
    /// Network byte order.
    pub(crate) imm_data: u32,
    pub(crate) rdma: ibv_rdma_wr,
    pub(crate) _qp_type: u32,
    pub(crate) _pad: u32,
    pub(crate) _bind_mw_or_tso: [u64; 6],
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        ibv_send_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            rdma: ibv_rdma_wr::default(),
            _qp_type: 0,
            _pad: 0,
            _bind_mw_or_tso: [0; 6],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_recv_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_recv_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_wc {
    pub(crate) wr_id: u64,
    pub(crate) status: c_uint,
    pub(crate) opcode: c_uint,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    /// Network byte order when `wc_flags & IBV_WC_WITH_IMM`.
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: c_uint,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_qp_cap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_qp_init_attr {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut ibv_opaque,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) qp_type: c_uint,
    pub(crate) sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ibv_global_route {
    pub(crate) dgid: ibv_gid,
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ibv_ah_attr {
    pub(crate) grh: ibv_global_route,
    pub(crate) dlid: u16,
    pub(crate) sl: u8,
    pub(crate) src_path_bits: u8,
    pub(crate) static_rate: u8,
    pub(crate) is_global: u8,
    pub(crate) port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ibv_qp_attr {
    pub(crate) qp_state: c_uint,
    pub(crate) cur_qp_state: c_uint,
    pub(crate) path_mtu: c_uint,
    pub(crate) path_mig_state: c_uint,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) qp_access_flags: c_uint,
    pub(crate) cap: ibv_qp_cap_eq,
    pub(crate) ah_attr: ibv_ah_attr,
    pub(crate) alt_ah_attr: ibv_ah_attr,
    pub(crate) pkey_index: u16,
    pub(crate) alt_pkey_index: u16,
    pub(crate) en_sqd_async_notify: u8,
    pub(crate) sq_draining: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) port_num: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) alt_port_num: u8,
    pub(crate) alt_timeout: u8,
    pub(crate) rate_limit: u32,
}

/// `struct ibv_qp_cap` inside `ibv_qp_attr` (same layout; `Eq` for tests).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ibv_qp_cap_eq {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

// enum ibv_qp_state
pub(crate) const IBV_QPS_RESET: c_uint = 0;
pub(crate) const IBV_QPS_INIT: c_uint = 1;
pub(crate) const IBV_QPS_RTR: c_uint = 2;
pub(crate) const IBV_QPS_RTS: c_uint = 3;
// enum ibv_qp_type
pub(crate) const IBV_QPT_RC: c_uint = 2;
// enum ibv_qp_attr_mask
pub(crate) const IBV_QP_STATE: u32 = 1 << 0;
pub(crate) const IBV_QP_ACCESS_FLAGS: u32 = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: u32 = 1 << 4;
pub(crate) const IBV_QP_PORT: u32 = 1 << 5;
pub(crate) const IBV_QP_AV: u32 = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: u32 = 1 << 8;
pub(crate) const IBV_QP_TIMEOUT: u32 = 1 << 9;
pub(crate) const IBV_QP_RETRY_CNT: u32 = 1 << 10;
pub(crate) const IBV_QP_RNR_RETRY: u32 = 1 << 11;
pub(crate) const IBV_QP_RQ_PSN: u32 = 1 << 12;
pub(crate) const IBV_QP_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
pub(crate) const IBV_QP_MIN_RNR_TIMER: u32 = 1 << 15;
pub(crate) const IBV_QP_SQ_PSN: u32 = 1 << 16;
pub(crate) const IBV_QP_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
pub(crate) const IBV_QP_DEST_QPN: u32 = 1 << 20;
// enum ibv_access_flags
pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub(crate) const IBV_ACCESS_REMOTE_READ: c_int = 4;
// enum ibv_wr_opcode
pub(crate) const IBV_WR_RDMA_WRITE: c_uint = 0;
pub(crate) const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
// enum ibv_send_flags
pub(crate) const IBV_SEND_SIGNALED: c_uint = 2;
// enum ibv_wc_opcode / ibv_wc_flags
pub(crate) const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = 129;
pub(crate) const IBV_WC_WITH_IMM: c_uint = 2;
// enum ibv_port_state
pub(crate) const IBV_PORT_ACTIVE: c_uint = 4;
// link layer
pub(crate) const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub(crate) const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

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

/// `ibv_poll_cq`: calls the provider's `poll_cq` through `cq->context->ops`.
///
/// # Safety
/// `cq` must be a live CQ from `ibv_create_cq`, and `wc` must point to
/// `n` writable `ibv_wc`s.
pub(crate) unsafe fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ points to its live context, whose ops table the
    // provider filled in at open time (the caller guarantees liveness).
    let f = unsafe { (*(*cq).context).ops.poll_cq };
    match f {
        // SAFETY: the provider's own poll_cq with the caller's valid args.
        Some(f) => unsafe { f(cq, n, wc) },
        None => -libc::ENOSYS,
    }
}

/// `ibv_post_send` through `qp->context->ops.post_send`.
///
/// # Safety
/// `qp` must be a live QP; `wr` a valid chain whose scatter lists name
/// registered memory that stays valid until the work completes.
pub(crate) unsafe fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: see `poll_cq`.
    let f = unsafe { (*(*qp).context).ops.post_send };
    match f {
        // SAFETY: the caller guarantees the work requests are valid.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::ENOSYS,
    }
}

/// `ibv_post_recv` through `qp->context->ops.post_recv`.
///
/// # Safety
/// As [`post_send`].
pub(crate) unsafe fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: see `poll_cq`.
    let f = unsafe { (*(*qp).context).ops.post_recv };
    match f {
        // SAFETY: the caller guarantees the work requests are valid.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::ENOSYS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// Sizes and offsets printed by a C program built against rdma-core
    /// 44's `infiniband/verbs.h` on x86_64 (see the module docs).
    #[test]
    fn layouts_match_verbs_h() {
        assert_eq!(offset_of!(ibv_context, ops), 8);
        assert_eq!(
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq),
            96
        );
        assert_eq!(
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
            208
        );
        assert_eq!(
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv),
            216
        );
        assert_eq!(size_of::<ibv_context_ops>(), 32 * 8);

        assert_eq!(size_of::<ibv_port_attr>(), 52);
        assert_eq!(offset_of!(ibv_port_attr, active_mtu), 8);
        assert_eq!(offset_of!(ibv_port_attr, gid_tbl_len), 12);
        assert_eq!(offset_of!(ibv_port_attr, lid), 34);
        assert_eq!(offset_of!(ibv_port_attr, active_width), 43);
        assert_eq!(offset_of!(ibv_port_attr, active_speed), 44);
        assert_eq!(offset_of!(ibv_port_attr, phys_state), 45);
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
        assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);

        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(offset_of!(ibv_wc, status), 8);
        assert_eq!(offset_of!(ibv_wc, opcode), 12);
        assert_eq!(offset_of!(ibv_wc, vendor_err), 16);
        assert_eq!(offset_of!(ibv_wc, byte_len), 20);
        assert_eq!(offset_of!(ibv_wc, imm_data), 24);
        assert_eq!(offset_of!(ibv_wc, qp_num), 28);
        assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
        assert_eq!(offset_of!(ibv_wc, dlid_path_bits), 45);

        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(align_of::<ibv_send_wr>(), 8);
        assert_eq!(offset_of!(ibv_send_wr, num_sge), 24);
        assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
        assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
        assert_eq!(offset_of!(ibv_send_wr, imm_data), 36);
        assert_eq!(offset_of!(ibv_send_wr, rdma), 40);
        assert_eq!(
            offset_of!(ibv_send_wr, rdma) + offset_of!(ibv_rdma_wr, rkey),
            48
        );
        assert_eq!(offset_of!(ibv_send_wr, _qp_type), 72);
        assert_eq!(offset_of!(ibv_send_wr, _bind_mw_or_tso), 80);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);

        assert_eq!(size_of::<ibv_gid>(), 16);
        assert_eq!(align_of::<ibv_gid>(), 8);
        assert_eq!(size_of::<ibv_global_route>(), 24);
        assert_eq!(align_of::<ibv_qp_attr>(), 8);
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(offset_of!(ibv_ah_attr, dlid), 24);
        assert_eq!(offset_of!(ibv_ah_attr, is_global), 29);
        assert_eq!(offset_of!(ibv_ah_attr, port_num), 30);
        assert_eq!(size_of::<ibv_qp_cap>(), 20);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(offset_of!(ibv_qp_init_attr, cap), 32);
        assert_eq!(offset_of!(ibv_qp_init_attr, qp_type), 52);
        assert_eq!(offset_of!(ibv_qp_init_attr, sq_sig_all), 56);

        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(offset_of!(ibv_qp_attr, qp_access_flags), 32);
        assert_eq!(offset_of!(ibv_qp_attr, cap), 36);
        assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
        assert_eq!(offset_of!(ibv_qp_attr, alt_ah_attr), 88);
        assert_eq!(offset_of!(ibv_qp_attr, pkey_index), 120);
        assert_eq!(offset_of!(ibv_qp_attr, max_rd_atomic), 126);
        assert_eq!(offset_of!(ibv_qp_attr, port_num), 129);
        assert_eq!(offset_of!(ibv_qp_attr, timeout), 130);
        assert_eq!(offset_of!(ibv_qp_attr, retry_cnt), 131);
        assert_eq!(offset_of!(ibv_qp_attr, rnr_retry), 132);
        assert_eq!(offset_of!(ibv_qp_attr, alt_timeout), 134);
        assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);

        assert_eq!(size_of::<ibv_device_attr>(), 232);
        assert_eq!(offset_of!(ibv_device_attr, max_mr_size), 80);
        assert_eq!(offset_of!(ibv_device_attr, max_qp_wr), 112);
        assert_eq!(offset_of!(ibv_device_attr, max_cqe), 132);
        assert_eq!(offset_of!(ibv_device_attr, max_qp_rd_atom), 144);
        assert_eq!(offset_of!(ibv_device_attr, max_qp_init_rd_atom), 156);
        assert_eq!(offset_of!(ibv_device_attr, atomic_cap), 164);
        assert_eq!(offset_of!(ibv_device_attr, max_pkeys), 224);
        assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);

        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
        assert_eq!(size_of::<ibv_mr>(), 48);
        assert_eq!(offset_of!(ibv_mr, length), 24);
        assert_eq!(offset_of!(ibv_mr, lkey), 36);
        assert_eq!(offset_of!(ibv_mr, rkey), 40);
    }

    #[test]
    fn missing_library_is_a_clean_error() {
        match Lib::load("libibverbs-nccl-rs-test-absent.so.1") {
            Err(LoadError::Open(msg)) => assert!(msg.contains("absent"), "{msg}"),
            other => panic!("expected an Open error, got {other:?}"),
        }
    }
}
