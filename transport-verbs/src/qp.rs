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

mod post;
mod transition;

pub(crate) use transition::{init_attr, rtr_attr, rts_attr};
pub use transition::{transition_mask, InitParams, QpState, RemoteAddr, RtrParams, RtsParams};

use crate::error::VerbsError;
use crate::sys;
use crate::verbs::{CqInner, PdInner};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

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
