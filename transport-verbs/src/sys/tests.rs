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
