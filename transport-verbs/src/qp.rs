//! Reliable-connected queue pairs as a typestate:
//! `Qp<Reset>` → `Qp<Init>` → `Qp<Rtr>` → `Qp<Rts>`.
//!
//! Each transition is one `ibv_modify_qp` whose attribute mask comes from the
//! pure table [`transition_mask`] and whose attributes are built by the pure
//! functions `init_attr`, `rtr_attr` and `rts_attr`; the unit tests
//! check that every attribute the mask names is filled in and that the
//! masks are those the InfiniBand spec requires for RC (the same set
//! `ibv_rc_pingpong` and NCCL use).
//!
//! Receives may be posted from `Init` on (before the peer can send); sends
//! only in `Rts`. The QP holds its PD and CQ (`Arc`s), so it is destroyed
//! before them.

use crate::error::VerbsError;
use crate::sys;
use crate::verbs::{CqInner, PdInner};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

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
    fn raw(self) -> u32 {
        match self {
            QpState::Reset => sys::IBV_QPS_RESET,
            QpState::Init => sys::IBV_QPS_INIT,
            QpState::Rtr => sys::IBV_QPS_RTR,
            QpState::Rts => sys::IBV_QPS_RTS,
        }
    }

    fn name(self) -> &'static str {
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

/// Typestate markers.
pub(crate) mod state {
    /// Created, not yet configured.
    pub(crate) enum Reset {}
    /// Configured; receives may be posted.
    pub(crate) enum Init {}
    /// Connected for receiving.
    pub(crate) enum Rtr {}
    /// Connected both ways.
    pub(crate) enum Rts {}
}

/// The owned `ibv_qp`.
struct QpInner {
    qp: NonNull<sys::ibv_qp>,
    qpn: u32,
    pd: Arc<PdInner>,
    _cq: Arc<CqInner>,
}

// SAFETY: see `verbs::ContextInner`: verbs are thread-safe.
unsafe impl Send for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        // SAFETY: we own the QP; its CQ and PD outlive it (held by Arc).
        let rc = unsafe { (self.pd.ctx.lib.destroy_qp)(self.qp.as_ptr()) };
        if rc != 0 {
            let msg = format!(
                "NET/IB: ibv_destroy_qp failed on {} (rc {rc})",
                self.pd.ctx.name
            );
            debug_assert!(false, "{msg}");
            tracing::error!("{msg}; leaking the QP");
        }
    }
}

/// An RC queue pair in state `S`.
pub(crate) struct Qp<S> {
    inner: QpInner,
    _state: PhantomData<S>,
}

/// Queue sizes of a new QP.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpCaps {
    pub(crate) send_wr: u32,
    pub(crate) recv_wr: u32,
}

impl<S> Qp<S> {
    /// The QP number the peer addresses.
    pub(crate) fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    pub(crate) fn as_raw(&self) -> *mut sys::ibv_qp {
        self.inner.qp.as_ptr()
    }

    fn modify<T>(
        self,
        from: QpState,
        to: QpState,
        attr: sys::ibv_qp_attr,
        peer: &str,
    ) -> Result<Qp<T>, VerbsError> {
        let mut attr = attr;
        debug_assert_eq!(attr.qp_state, to.raw());
        let mask = transition_mask(from, to).unwrap_or(0);
        // SAFETY: live QP; `attr` is a complete ibv_qp_attr.
        let rc =
            unsafe { (self.inner.pd.ctx.lib.modify_qp)(self.as_raw(), &mut attr, mask as i32) };
        if rc != 0 {
            return Err(VerbsError::ModifyQp {
                to: to.name(),
                device: self.inner.pd.ctx.name.clone(),
                peer: peer.to_owned(),
                source: std::io::Error::from_raw_os_error(rc.abs()),
            });
        }
        Ok(Qp {
            inner: self.inner,
            _state: PhantomData,
        })
    }
}

impl Qp<state::Reset> {
    /// `ibv_create_qp`: an RC QP on `pd` with both queues on `cq`.
    pub(crate) fn create(
        pd: &Arc<PdInner>,
        cq: &Arc<CqInner>,
        caps: QpCaps,
    ) -> Result<Self, VerbsError> {
        let mut init = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.as_raw(),
            recv_cq: cq.as_raw(),
            srq: std::ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: caps.send_wr,
                max_recv_wr: caps.recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQ (same context); `init` is complete.
        let qp = unsafe { (pd.ctx.lib.create_qp)(pd.as_raw(), &mut init) };
        let qp =
            NonNull::new(qp).ok_or_else(|| VerbsError::verb("ibv_create_qp", &pd.ctx.name, 0))?;
        // SAFETY: the QP was just created and is live.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        Ok(Qp {
            inner: QpInner {
                qp,
                qpn,
                pd: Arc::clone(pd),
                _cq: Arc::clone(cq),
            },
            _state: PhantomData,
        })
    }

    /// RESET → INIT.
    pub(crate) fn init(self, p: &InitParams) -> Result<Qp<state::Init>, VerbsError> {
        self.modify(QpState::Reset, QpState::Init, init_attr(p).0, "-")
    }
}

impl Qp<state::Init> {
    /// INIT → RTR: connects the receive side to the peer QP.
    pub(crate) fn ready_to_receive(
        self,
        p: &RtrParams,
        peer: &str,
    ) -> Result<Qp<state::Rtr>, VerbsError> {
        self.modify(QpState::Init, QpState::Rtr, rtr_attr(p).0, peer)
    }
}

impl Qp<state::Rtr> {
    /// RTR → RTS.
    pub(crate) fn ready_to_send(
        self,
        p: &RtsParams,
        peer: &str,
    ) -> Result<Qp<state::Rts>, VerbsError> {
        self.modify(QpState::Rtr, QpState::Rts, rts_attr(p).0, peer)
    }
}

/// Receives may be posted from INIT on.
pub(crate) trait CanRecv {}
impl CanRecv for state::Init {}
impl CanRecv for state::Rtr {}
impl CanRecv for state::Rts {}

impl<S: CanRecv> Qp<S> {
    /// Posts `n` zero-length receives (they only consume the immediate data
    /// of RDMA writes), with `wr_id`.
    pub(crate) fn post_empty_recvs(&self, n: usize, wr_id: u64) -> Result<(), VerbsError> {
        for _ in 0..n {
            let mut wr = sys::ibv_recv_wr {
                wr_id,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: live QP in INIT or later; the WR has no scatter list,
            // so no memory must outlive the call.
            let rc = unsafe { sys::post_recv(self.as_raw(), &mut wr, &mut bad) };
            if rc != 0 {
                return Err(VerbsError::verb(
                    "ibv_post_recv",
                    &self.inner.pd.ctx.name,
                    rc,
                ));
            }
        }
        Ok(())
    }
}

impl Qp<state::Rts> {
    /// Posts a chain of send work requests.
    ///
    /// # Safety
    /// `wr` must be a valid chain (`next` pointers into live WRs, scatter
    /// lists into live SGEs for the duration of the call). The memory named
    /// by the SGEs must be registered with the given lkeys and stay valid,
    /// unmodified, until the completion of the chain's signaled WR has been
    /// polled; the remote ranges must be ones the peer granted.
    pub(crate) unsafe fn post_send(&self, wr: *mut sys::ibv_send_wr) -> Result<(), VerbsError> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP in RTS; the caller guarantees the chain.
        let rc = unsafe { sys::post_send(self.as_raw(), wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::verb(
                "ibv_post_send",
                &self.inner.pd.ctx.name,
                rc,
            ));
        }
        Ok(())
    }
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
