//! Posting work requests: empty receives from INIT on, send chains in RTS.

use super::{state, CanRecv, Qp};
use crate::error::VerbsError;
use crate::sys;

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
