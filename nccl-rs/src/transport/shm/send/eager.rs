//! The sender's tiny-message path ([`nccl_net::SendComm::send_eager`]): a
//! message of at most [`eager_limit`] bytes written into the ring as one
//! sealed frame at once (see [`super::super::ring`]'s `seal`), with no
//! request to queue, progress or test.
//!
//! Ordering, on any CPU: the frame's bytes are plain stores, made visible
//! by a Release store (the seal, or the head counter) that the receiver
//! reads with Acquire (`recv/eager.rs`); nothing relies on x86's in-order
//! stores, and the one fence added for weakly ordered CPUs is no
//! instruction on x86.

use super::super::comm::Fault;
use super::super::ring::{
    eager_limit, encode_header, frame_span, Payload, FRAME_ALIGN, HDR_BYTES, INLINE_MAX, SEALED_MAX,
};
use super::ShmSendComm;
use nccl_net::{NetError, NetResult};
use std::ptr;
use std::sync::atomic::{fence, Ordering};

impl ShmSendComm {
    /// The largest message [`ShmSendComm::eager`] takes.
    pub(super) fn eager_limit(&self) -> usize {
        eager_limit(self.prod.capacity())
    }

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
        let limit = self.eager_limit();
        if len > limit {
            return Err(NetError::Other(format!(
                "SHM: an eager send takes at most {limit} bytes, not {len}"
            )));
        }
        if self.nwritten != self.q.len() {
            // Earlier sends keep their place in the stream.
            self.progress();
            if self.nwritten != self.q.len() {
                return self.fault_or(false);
            }
        }
        let span = frame_span(len).expect("len <= the eager limit");
        match self.eager_room(span) {
            Ok(true) => {}
            Ok(false) => return self.fault_or(false),
            Err(f) => {
                self.fail(f);
                return self.fault_or(false);
            }
        }
        let dst = self.prod.head_ptr();
        let hdr = encode_header(tag, len as u64, Payload::Ring);
        // SAFETY: `eager_room` says the `span` bytes from the head are ours
        // (the consumer reads nothing past the published head, nor a frame
        // before its seal). The header line at the head is contiguous
        // (frames start FRAME_ALIGN-aligned, slots are multiples of it); a
        // payload of up to INLINE_MAX bytes fills at most the rest of that
        // line, a longer one the `span - FRAME_ALIGN` bytes after it,
        // wrapping at the ring's end. The payload is readable per the
        // contract.
        unsafe {
            if len > INLINE_MAX {
                self.prod.write_ahead(FRAME_ALIGN, data, len);
            }
            ptr::copy_nonoverlapping(hdr.as_ptr(), dst, HDR_BYTES);
        }
        if len > SEALED_MAX && len <= INLINE_MAX {
            // The header is visible before any payload byte: an inline
            // payload of 41 to 48 bytes reaches the seal's word, and a
            // receiver that read it there as a seal (Acquire) must not see
            // a line without its header. Not implied by program order on
            // weakly ordered CPUs (aarch64); free on x86, whose stores are
            // seen in order.
            fence(Ordering::Release);
        }
        if len > 0 && len <= INLINE_MAX {
            // SAFETY: as above (the payload fills at most the rest of the
            // header line, which is ours).
            unsafe { ptr::copy_nonoverlapping(data, dst.add(HDR_BYTES), len) };
        }
        if len <= SEALED_MAX || len > INLINE_MAX {
            // (41 to 48 bytes inline reach the seal's word: the receiver
            // finds that frame through our counter.) Release: every byte
            // of the frame above is visible to whoever sees the seal.
            self.prod.seal_head();
        }
        self.prod.advance(span);
        self.prod.publish();
        self.watch.progressed();
        Ok(true)
    }

    /// Whether `span` bytes are free at the head; while they are not,
    /// watches the receiver ([`super::super::peer`]) and fails if it is
    /// gone.
    fn eager_room(&mut self, span: usize) -> Result<bool, Fault> {
        if self.prod.free(span).map_err(Fault::Corrupt)? >= span {
            return Ok(true);
        }
        if !self.watch.stalled(&self.seg.header().recv.0) {
            return Ok(false);
        }
        // One last look: it may have made room before it left.
        if self.prod.free(span).map_err(Fault::Corrupt)? >= span {
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
