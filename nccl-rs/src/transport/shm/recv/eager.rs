//! The receiver's tiny-message path ([`nccl_net::RecvComm::recv_eager`]):
//! the frame line at the tail read straight into the caller's buffer, with
//! no request to post, progress or test. A sealed frame (see
//! [`super::super::ring`]'s `seal`) is seen on its own line; any other
//! through the producer's counter.

use super::super::comm::Fault;
use super::super::ring::{Payload, FRAME_ALIGN, INLINE_MAX, SEALED_MAX};
use super::{RecvOp, ShmRecvComm};
use nccl_net::{NetError, NetResult};

impl ShmRecvComm {
    /// See [`nccl_net::RecvComm::recv_eager`].
    ///
    /// # Safety
    /// `data..data+cap` must be valid for writes for the duration of the
    /// call.
    pub(super) unsafe fn eager(
        &mut self,
        data: *mut u8,
        cap: usize,
        tag: u32,
    ) -> NetResult<Option<usize>> {
        if let Some(f) = self.fault {
            return Err(f.to_error(self.watch.pid()));
        }
        if cap > SEALED_MAX {
            return Err(NetError::Other(format!(
                "SHM: an eager receive takes at most {SEALED_MAX} bytes, not {cap}"
            )));
        }
        if !self.q.is_empty() || self.lent.is_some() || self.open.is_some() {
            return Err(NetError::Other(
                "SHM: an eager receive while receives are posted".into(),
            ));
        }
        let got = match self.eager_frame(data, cap, tag) {
            Ok(None) if self.watch.stalled(&self.seg.header().send.0) => {
                // The sender published its last frames before it set its
                // flag (or died): look once more before reporting.
                match self.eager_frame(data, cap, tag) {
                    Ok(None) => Err(Fault::Closed),
                    other => other,
                }
            }
            other => other,
        };
        match got {
            Ok(Some(len)) => {
                self.watch.progressed();
                Ok(Some(len))
            }
            Ok(None) => Ok(None),
            Err(f) => {
                self.fail(f);
                Err(f.to_error(self.watch.pid()))
            }
        }
    }

    /// Reads the frame at the tail into `data` if one is published.
    fn eager_frame(&mut self, data: *mut u8, cap: usize, tag: u32) -> Result<Option<usize>, Fault> {
        if !self.cons.sealed()
            && self.cons.avail(FRAME_ALIGN).map_err(Fault::Corrupt)? < FRAME_ALIGN
        {
            return Ok(None);
        }
        let op = RecvOp {
            data,
            cap,
            tag,
            len: 0,
            span: 0,
            pos: 0,
            lend: false,
            lent: None,
        };
        // Checks the tag and the length and copies an inline payload into
        // `data` (writable for `cap` bytes per the caller's contract).
        let (len, how, ..) = self.read_header(&op)?;
        if how != Payload::Ring || len > INLINE_MAX {
            // `len <= cap <= SEALED_MAX < INLINE_MAX`: a sender sends that
            // inline.
            return Err(Fault::Corrupt("a short message not sent inline"));
        }
        self.cons.advance(FRAME_ALIGN);
        // Release: our read of the line is over before the producer sees it
        // free.
        self.cons.publish();
        Ok(Some(len))
    }
}
