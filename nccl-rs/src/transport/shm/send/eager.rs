//! The sender's tiny-message path ([`nccl_net::SendComm::send_eager`]): a
//! message of at most [`SEALED_MAX`] bytes written into one sealed frame
//! line at once (see [`super::super::ring`]'s `seal`), with no request to
//! queue, progress or test.

use super::super::comm::Fault;
use super::super::ring::{encode_header, Payload, FRAME_ALIGN, HDR_BYTES, SEALED_MAX};
use super::ShmSendComm;
use nccl_net::{NetError, NetResult};
use std::ptr;

impl ShmSendComm {
    /// See [`nccl_net::SendComm::send_eager`].
    ///
    /// # Safety
    /// `data..data+len` must be valid for reads for the duration of the
    /// call.
    pub(super) unsafe fn eager(
        &mut self,
        data: *const u8,
        len: usize,
        tag: u32,
    ) -> NetResult<bool> {
        if let Some(f) = self.fault {
            return Err(f.to_error(self.watch.pid()));
        }
        if len > SEALED_MAX {
            return Err(NetError::Other(format!(
                "SHM: an eager send takes at most {SEALED_MAX} bytes, not {len}"
            )));
        }
        if self.nwritten != self.q.len() {
            // Earlier sends keep their place in the stream.
            self.progress();
            if self.nwritten != self.q.len() {
                return self.fault_or(false);
            }
        }
        match self.eager_room() {
            Ok(true) => {}
            Ok(false) => return self.fault_or(false),
            Err(f) => {
                self.fail(f);
                return self.fault_or(false);
            }
        }
        let dst = self.prod.head_ptr();
        let hdr = encode_header(tag, len as u64, Payload::Ring);
        // SAFETY: `eager_room` says the FRAME_ALIGN bytes at the head are
        // ours (the consumer reads nothing past the published head) and
        // contiguous (frames start FRAME_ALIGN-aligned, slots are multiples
        // of it); the header and `len <= SEALED_MAX` payload bytes fill at
        // most that line up to its seal. The payload is readable per the
        // contract.
        unsafe {
            ptr::copy_nonoverlapping(hdr.as_ptr(), dst, HDR_BYTES);
            if len > 0 {
                ptr::copy_nonoverlapping(data, dst.add(HDR_BYTES), len);
            }
        }
        self.prod.seal_head();
        self.prod.advance(FRAME_ALIGN);
        self.prod.publish();
        self.watch.progressed();
        Ok(true)
    }

    /// Whether a frame line is free at the head; while none is, watches
    /// the receiver ([`super::super::peer`]) and fails if it is gone.
    fn eager_room(&mut self) -> Result<bool, Fault> {
        if self.prod.free(FRAME_ALIGN).map_err(Fault::Corrupt)? >= FRAME_ALIGN {
            return Ok(true);
        }
        if !self.watch.stalled(&self.seg.header().recv.0) {
            return Ok(false);
        }
        // One last look: it may have made room before it left.
        if self.prod.free(FRAME_ALIGN).map_err(Fault::Corrupt)? >= FRAME_ALIGN {
            return Ok(true);
        }
        Err(Fault::Closed)
    }

    /// `Ok(ok)`, or the recorded fault.
    fn fault_or(&self, ok: bool) -> NetResult<bool> {
        match self.fault {
            Some(f) => Err(f.to_error(self.watch.pid())),
            None => Ok(ok),
        }
    }
}
