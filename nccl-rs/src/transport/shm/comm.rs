//! The data path: [`ShmSendComm`] and [`ShmRecvComm`], and what they share.
//!
//! Both comms keep a FIFO of posted requests in a `VecDeque` allocated once
//! with room for [`MAX_REQUESTS`](super::MAX_REQUESTS), so nothing
//! allocates per message. Requests complete in posting order; completed
//! ones stay at the front (flagged once reported) until every older one has
//! been reported. Every `test` first moves as many bytes as the ring allows,
//! without waiting, then answers. A fault (closed peer, tag mismatch,
//! truncation, corrupt stream, failed single-copy read) is remembered and
//! reported by every later call that needs the connection.

use super::ring::RingPtrs;
use super::segment::{Segment, Side};
use nccl_net::{NetError, Request};
use std::sync::atomic::Ordering;

pub(super) use super::recv::ShmRecvComm;
pub(super) use super::send::ShmSendComm;

/// A remembered failure.
#[derive(Clone, Copy, Debug)]
pub(super) enum Fault {
    Closed,
    Tag {
        expected: u32,
        got: u32,
    },
    Truncated {
        posted: usize,
        got: usize,
    },
    Corrupt(&'static str),
    /// `process_vm_readv` failed with this OS error.
    Cma(i32),
    /// The sender's `process_vm_writev` of its part of a split message
    /// failed with this OS error.
    Helper(i32),
}

impl Fault {
    pub(super) fn to_error(self, pid: i32) -> NetError {
        match self {
            Fault::Closed => NetError::Closed(format!("shm peer pid {pid}")),
            Fault::Tag { expected, got } => NetError::TagMismatch { expected, got },
            Fault::Truncated { posted, got } => NetError::Truncated { posted, got },
            Fault::Corrupt(why) => NetError::Protocol(format!("SHM ring from pid {pid}: {why}")),
            Fault::Cma(errno) => {
                NetError::io("process_vm_readv", std::io::Error::from_raw_os_error(errno))
            }
            Fault::Helper(errno) => NetError::io(
                "process_vm_writev by the sender",
                std::io::Error::from_raw_os_error(errno),
            ),
        }
    }
}

pub(super) fn unknown_request(req: Request) -> NetError {
    NetError::Other(format!(
        "SHM: unknown request {} (never posted on this comm, or already reported complete)",
        req.0
    ))
}

/// Builds the ring view of `seg`.
pub(super) fn ring_of(seg: &Segment) -> RingPtrs {
    let g = seg.geometry();
    let h = seg.header();
    // SAFETY: the ring and counters live in `seg`'s mapping, which the comm
    // owns for as long as it uses the producer / consumer built from this;
    // the geometry was validated (slot a multiple of FRAME_ALIGN dividing
    // the ring); the connector claimed the sending side with a
    // compare-exchange and the listener accepts once, so there is one
    // producer and one consumer.
    unsafe {
        RingPtrs::new(
            seg.data(),
            g.ring_bytes,
            g.slot_bytes,
            &h.head.0,
            &h.tail.0,
            // The nonce's second word: random, written before either side
            // maps the segment's ring (the handle carries it too).
            h.info.0.nonce[1].load(Ordering::Relaxed),
        )
    }
}

/// Marks our side closed so the peer stops waiting for us.
pub(super) fn mark_closed(side: &Side) {
    side.closed.store(1, Ordering::Release);
}

/// Copies `len` bytes from `src` to `dst` (a ring's payload in or out),
/// with streaming stores where `stream` says so and the copy is at least
/// [`STREAM_PIECE_MIN`](crate::reduce::STREAM_PIECE_MIN) long, else with
/// `copy_mem`. Returns whether it streamed. Streaming ends with a store
/// fence, so a publication after it orders after the bytes.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]; nobody else accesses `dst..dst+len`
/// during the call.
pub(super) unsafe fn copy_payload(src: *const u8, dst: *mut u8, len: usize, stream: bool) -> bool {
    if stream && len >= crate::reduce::STREAM_PIECE_MIN {
        // SAFETY: the caller's contract: both ranges valid, disjoint, and
        // the destination ours alone for the call.
        let (d, s) = unsafe {
            (
                std::slice::from_raw_parts_mut(dst, len),
                std::slice::from_raw_parts(src, len),
            )
        };
        crate::reduce::copy_streaming(d, s);
        true
    } else {
        // SAFETY: the caller's contract.
        unsafe { crate::reduce::copy_mem(src, dst, len) };
        false
    }
}
