//! The `verbs.h` enum values this crate passes or checks.

use std::ffi::{c_int, c_uint};

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
