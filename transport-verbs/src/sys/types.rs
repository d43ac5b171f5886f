//! The C structs of `infiniband/verbs.h` this crate touches: complete where
//! we allocate them, a prefix where the provider does (see the `sys` docs).

use std::ffi::{c_char, c_int, c_uint, c_void};

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
