//! The receiver's tiny-message path ([`nccl_net::RecvComm::recv_eager`]):
//! the frame line at the tail read straight into the caller's buffer, with
//! no request to post, progress or test. A sealed frame (see
//! [`super::super::ring`]'s `seal`) is seen on its own line; any other
//! through the producer's counter.

use super::super::comm::Fault;
use super::super::ring::{eager_limit, span_of, Payload, FRAME_ALIGN, INLINE_MAX};
use super::{RecvOp, ShmRecvComm, Src};
use nccl_net::{NetError, NetResult};

impl ShmRecvComm {
    /// The largest message [`ShmRecvComm::eager`] takes.
    pub(super) fn eager_limit(&self) -> usize {
        eager_limit(self.cons.capacity())
    }

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
        let limit = self.eager_limit();
        if cap > limit {
            return Err(NetError::Other(format!(
                "SHM: an eager receive takes at most {limit} bytes, not {cap}"
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

    /// Reads the frame at the tail into `data` if one is published (or
    /// sealed).
    fn eager_frame(&mut self, data: *mut u8, cap: usize, tag: u32) -> Result<Option<usize>, Fault> {
        // The frame's bytes are read only after an Acquire load showed them
        // written: the seal's word (`sealed`) or the producer's counter
        // (`avail`), each paired with the sender's Release store, so they
        // are whole on weakly ordered CPUs too (free on x86).
        let sealed = self.cons.sealed();
        if !sealed && self.cons.avail(FRAME_ALIGN).map_err(Fault::Corrupt)? < FRAME_ALIGN {
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
            stream: false,
        };
        // Checks the tag and the length and copies an inline payload into
        // `data` (writable for `cap` bytes per the caller's contract).
        let (len, how, addr, _, mapped) = self.read_header(&op)?;
        let span = span_of(len, how).expect("len <= cap");
        match how {
            // A sender that took the request path (it could not tell that
            // we receive eagerly) may send single copy: read it from there.
            Payload::Cma => {
                let src = mapped
                    .and_then(|m| self.maps.resolve(self.watch.pid(), &m, len))
                    .map_or(Src::Remote(addr), |p| Src::Local(p.cast_const()));
                self.read_peer(&op, 0, len, src)?;
            }
            Payload::Ring if len > INLINE_MAX => {
                // Sealed: written before the seal. Else: once published.
                if !sealed && self.cons.avail(span).map_err(Fault::Corrupt)? < span {
                    return Ok(None);
                }
                // SAFETY: the payload's `len` bytes after the header line
                // are sealed or published, and not released; `data` is
                // writable for `cap >= len` bytes (contract).
                unsafe { self.cons.read_ahead(FRAME_ALIGN, data, len) };
            }
            Payload::Ring => {}
        }
        self.cons.advance(span);
        // Release: our reads of the frame (and of the sender's memory) are
        // over before the producer sees it free.
        self.cons.publish();
        Ok(Some(len))
    }
}
