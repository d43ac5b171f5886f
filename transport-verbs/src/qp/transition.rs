//! The pure transition table: the `ibv_modify_qp` mask of each RC state
//! change and the attributes that go with it.

use crate::sys;

/// A QP state (the subset an RC connection walks through).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Just created.
    Reset,
    /// Port, P_Key and access set; receives may be posted.
    Init,
    /// Ready to receive: knows the remote QP.
    Rtr,
    /// Ready to send.
    Rts,
}

impl QpState {
    pub(super) fn raw(self) -> u32 {
        match self {
            QpState::Reset => sys::IBV_QPS_RESET,
            QpState::Init => sys::IBV_QPS_INIT,
            QpState::Rtr => sys::IBV_QPS_RTR,
            QpState::Rts => sys::IBV_QPS_RTS,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
        }
    }
}

/// The `ibv_modify_qp` attribute mask of an RC transition, or `None` for a
/// transition we never make.
pub const fn transition_mask(from: QpState, to: QpState) -> Option<u32> {
    use QpState::*;
    match (from, to) {
        (Reset, Init) => Some(
            sys::IBV_QP_STATE
                | sys::IBV_QP_PKEY_INDEX
                | sys::IBV_QP_PORT
                | sys::IBV_QP_ACCESS_FLAGS,
        ),
        (Init, Rtr) => Some(
            sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER,
        ),
        (Rtr, Rts) => Some(
            sys::IBV_QP_STATE
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_MAX_QP_RD_ATOMIC,
        ),
        _ => None,
    }
}

/// How the remote port is addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAddr {
    /// InfiniBand: local identifier (no GRH).
    Lid(u16),
    /// RoCE (or routed IB): global route with the peer's GID.
    Gid {
        /// Peer GID.
        gid: [u8; 16],
        /// Our GID index to send from.
        sgid_index: u8,
        /// `NCCL_IB_TC`.
        traffic_class: u8,
    },
}

/// Parameters of RESET → INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitParams {
    /// Local port number.
    pub port: u8,
    /// Remote access granted on this QP (`IBV_ACCESS_*`).
    pub access: u32,
}

/// Parameters of INIT → RTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrParams {
    /// Local port number.
    pub port: u8,
    /// Path MTU (`enum ibv_mtu`: 1 = 256 … 5 = 4096).
    pub mtu: u32,
    /// Peer QP number.
    pub dest_qpn: u32,
    /// Peer's first PSN.
    pub rq_psn: u32,
    /// Peer address.
    pub remote: RemoteAddr,
    /// `NCCL_IB_SL`.
    pub service_level: u8,
}

/// Parameters of RTR → RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsParams {
    /// Our first PSN.
    pub sq_psn: u32,
    /// `NCCL_IB_TIMEOUT`.
    pub timeout: u8,
    /// `NCCL_IB_RETRY_CNT`.
    pub retry_cnt: u8,
}

/// RDMA reads/atomics in flight per QP (we issue none, but peers may).
const RD_ATOMIC: u8 = 1;
/// `min_rnr_timer` 12 = 0.64 ms, as NCCL.
const MIN_RNR_TIMER: u8 = 12;
/// `rnr_retry` 7 = retry forever, as NCCL.
const RNR_RETRY: u8 = 7;
/// GRH hop limit.
const HOP_LIMIT: u8 = 255;

/// Attributes of RESET → INIT, with their mask.
pub(crate) fn init_attr(p: &InitParams) -> (sys::ibv_qp_attr, u32) {
    let attr = sys::ibv_qp_attr {
        qp_state: sys::IBV_QPS_INIT,
        pkey_index: 0,
        port_num: p.port,
        qp_access_flags: p.access,
        ..Default::default()
    };
    (
        attr,
        transition_mask(QpState::Reset, QpState::Init).unwrap_or(0),
    )
}

/// Attributes of INIT → RTR, with their mask.
pub(crate) fn rtr_attr(p: &RtrParams) -> (sys::ibv_qp_attr, u32) {
    let mut ah = sys::ibv_ah_attr {
        sl: p.service_level,
        port_num: p.port,
        ..Default::default()
    };
    match p.remote {
        RemoteAddr::Lid(lid) => ah.dlid = lid,
        RemoteAddr::Gid {
            gid,
            sgid_index,
            traffic_class,
        } => {
            ah.is_global = 1;
            ah.grh = sys::ibv_global_route {
                dgid: sys::ibv_gid { raw: gid },
                flow_label: 0,
                sgid_index,
                hop_limit: HOP_LIMIT,
                traffic_class,
            };
        }
    }
    let attr = sys::ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTR,
        path_mtu: p.mtu,
        dest_qp_num: p.dest_qpn,
        rq_psn: p.rq_psn,
        max_dest_rd_atomic: RD_ATOMIC,
        min_rnr_timer: MIN_RNR_TIMER,
        ah_attr: ah,
        ..Default::default()
    };
    (
        attr,
        transition_mask(QpState::Init, QpState::Rtr).unwrap_or(0),
    )
}

/// Attributes of RTR → RTS, with their mask.
pub(crate) fn rts_attr(p: &RtsParams) -> (sys::ibv_qp_attr, u32) {
    let attr = sys::ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTS,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry: RNR_RETRY,
        sq_psn: p.sq_psn,
        max_rd_atomic: RD_ATOMIC,
        ..Default::default()
    };
    (
        attr,
        transition_mask(QpState::Rtr, QpState::Rts).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::*;

    #[test]
    fn masks_are_the_rc_sets() {
        assert_eq!(
            transition_mask(Reset, Init),
            Some(
                sys::IBV_QP_STATE
                    | sys::IBV_QP_PKEY_INDEX
                    | sys::IBV_QP_PORT
                    | sys::IBV_QP_ACCESS_FLAGS
            )
        );
        // Exact numeric values, as ibv_rc_pingpong's masks add up.
        assert_eq!(transition_mask(Reset, Init), Some(0x39));
        assert_eq!(
            transition_mask(Init, Rtr),
            Some(0x1 | 0x80 | 0x100 | 0x100000 | 0x1000 | 0x20000 | 0x8000)
        );
        assert_eq!(
            transition_mask(Rtr, Rts),
            Some(0x1 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x2000)
        );
        for (a, b) in [
            (Reset, Rtr),
            (Reset, Rts),
            (Init, Rts),
            (Rts, Init),
            (Init, Init),
            (Rts, Reset),
        ] {
            assert_eq!(transition_mask(a, b), None, "{a:?} -> {b:?}");
        }
    }

    #[test]
    fn init_attr_fills_its_mask() {
        let (a, m) = init_attr(&InitParams { port: 1, access: 7 });
        assert_eq!(m, transition_mask(Reset, Init).unwrap());
        assert_eq!(
            (a.qp_state, a.port_num, a.pkey_index, a.qp_access_flags),
            (sys::IBV_QPS_INIT, 1, 0, 7)
        );
    }

    #[test]
    fn rtr_attr_for_roce_and_ib() {
        let gid = [0xfe; 16];
        let roce = RtrParams {
            port: 1,
            mtu: 3,
            dest_qpn: 0x11,
            rq_psn: 0xabcdef,
            remote: RemoteAddr::Gid {
                gid,
                sgid_index: 3,
                traffic_class: 106,
            },
            service_level: 5,
        };
        let (a, m) = rtr_attr(&roce);
        assert_eq!(m, transition_mask(Init, Rtr).unwrap());
        assert_eq!(a.qp_state, sys::IBV_QPS_RTR);
        assert_eq!((a.path_mtu, a.dest_qp_num, a.rq_psn), (3, 0x11, 0xabcdef));
        assert_eq!(
            (a.max_dest_rd_atomic, a.min_rnr_timer),
            (RD_ATOMIC, MIN_RNR_TIMER)
        );
        assert_eq!(a.ah_attr.is_global, 1);
        assert_eq!(a.ah_attr.grh.dgid.raw, gid);
        assert_eq!(
            (a.ah_attr.grh.sgid_index, a.ah_attr.grh.traffic_class),
            (3, 106)
        );
        assert_eq!(a.ah_attr.grh.hop_limit, HOP_LIMIT);
        assert_eq!((a.ah_attr.sl, a.ah_attr.port_num), (5, 1));

        let (b, _) = rtr_attr(&RtrParams {
            remote: RemoteAddr::Lid(0x42),
            ..roce
        });
        assert_eq!((b.ah_attr.is_global, b.ah_attr.dlid), (0, 0x42));
        assert_eq!(b.ah_attr.grh, sys::ibv_global_route::default());
    }

    #[test]
    fn rts_attr_carries_timeout_and_retries() {
        let (a, m) = rts_attr(&RtsParams {
            sq_psn: 77,
            timeout: 14,
            retry_cnt: 3,
        });
        assert_eq!(m, transition_mask(Rtr, Rts).unwrap());
        assert_eq!(a.qp_state, sys::IBV_QPS_RTS);
        assert_eq!(
            (
                a.sq_psn,
                a.timeout,
                a.retry_cnt,
                a.rnr_retry,
                a.max_rd_atomic
            ),
            (77, 14, 3, RNR_RETRY, RD_ATOMIC)
        );
    }
}
