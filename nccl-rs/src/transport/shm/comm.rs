//! The data path: [`ShmSendComm`] and [`ShmRecvComm`].
//!
//! Both comms keep a FIFO of posted requests in a `VecDeque` allocated once
//! with room for [`MAX_REQUESTS`], so nothing allocates per message.
//! Requests complete in posting order; completed ones stay at the front
//! (flagged once reported) until every older one has been reported. Every
//! `test` first moves as many bytes as the ring allows, without waiting,
//! then answers. A fault (closed peer, tag mismatch, truncation, corrupt
//! stream) is remembered and reported by every later call that needs the
//! connection.

use super::peer::PeerWatch;
use super::ring::{
    decode_header, encode_header, frame_span, Consumer, Producer, RingPtrs, FRAME_ALIGN, HDR_BYTES,
    INLINE_MAX,
};
use super::segment::{Segment, Side};
use super::{MAX_MESSAGE_BYTES, MAX_REQUESTS};
use nccl_net::{MemHandle, NetError, NetResult, RecvComm, Request, SendComm};
use std::collections::VecDeque;
use std::ptr;
use std::sync::atomic::Ordering;

/// A remembered failure.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Closed,
    Tag { expected: u32, got: u32 },
    Truncated { posted: usize, got: usize },
    Corrupt(&'static str),
}

impl Fault {
    fn to_error(self, pid: i32) -> NetError {
        match self {
            Fault::Closed => NetError::Closed(format!("shm peer pid {pid}")),
            Fault::Tag { expected, got } => NetError::TagMismatch { expected, got },
            Fault::Truncated { posted, got } => NetError::Truncated { posted, got },
            Fault::Corrupt(why) => NetError::Protocol(format!("SHM ring from pid {pid}: {why}")),
        }
    }
}

fn unknown_request(req: Request) -> NetError {
    NetError::Other(format!(
        "SHM: unknown request {} (never posted on this comm, or already reported complete)",
        req.0
    ))
}

/// Builds the ring view of `seg`.
fn ring_of(seg: &Segment) -> RingPtrs {
    let g = seg.geometry();
    let h = seg.header();
    // SAFETY: the ring and counters live in `seg`'s mapping, which the comm
    // owns for as long as it uses the producer / consumer built from this;
    // the geometry was validated (slot a multiple of FRAME_ALIGN dividing
    // the ring); the connector claimed the sending side with a
    // compare-exchange and the listener accepts once, so there is one
    // producer and one consumer.
    unsafe { RingPtrs::new(seg.data(), g.ring_bytes, g.slot_bytes, &h.head.0, &h.tail.0) }
}

/// Marks our side closed so the peer stops waiting for us.
fn mark_closed(side: &Side) {
    side.closed.store(1, Ordering::Release);
}

struct SendOp {
    id: u64,
    data: *const u8,
    len: usize,
    tag: u32,
    /// Bytes of the frame written so far (0..=frame_span(len)).
    pos: usize,
    reported: bool,
}

/// The sending half: the producer of the ring.
pub(super) struct ShmSendComm {
    prod: Producer,
    watch: PeerWatch,
    q: VecDeque<SendOp>,
    /// Number of completed requests at the front of `q`.
    ndone: usize,
    next_id: u64,
    fault: Option<Fault>,
    /// Declared last: the mapping outlives the ring pointers above.
    seg: Segment,
}

// SAFETY: the raw pointers (the caller's send buffers, the mapping) are
// valid from any thread: the `isend` contract keeps the buffers readable
// until completion or drop, and the mapping lives as long as the comm.
unsafe impl Send for ShmSendComm {}

impl ShmSendComm {
    /// A comm over a segment whose sending side we have claimed; the
    /// receiver is `peer_pid` in pid namespace `peer_pidns`.
    pub(super) fn new(seg: Segment, peer_pid: i32, peer_pidns: u64) -> ShmSendComm {
        ShmSendComm {
            prod: Producer::new(ring_of(&seg)),
            watch: PeerWatch::new(peer_pid, peer_pidns),
            q: VecDeque::with_capacity(MAX_REQUESTS),
            ndone: 0,
            next_id: 1,
            fault: None,
            seg,
        }
    }

    /// Writes as much of the queued messages as the ring takes. Returns
    /// whether any byte moved.
    fn pump(&mut self) -> Result<bool, Fault> {
        let ShmSendComm { prod, q, ndone, .. } = self;
        let mut moved = false;
        while let Some(op) = q.get_mut(*ndone) {
            let span = frame_span(op.len).expect("isend checked the size");
            if op.pos == 0 {
                if prod.free(FRAME_ALIGN).map_err(Fault::Corrupt)? < FRAME_ALIGN {
                    break;
                }
                let dst = prod.head_ptr();
                let hdr = encode_header(op.tag, op.len as u64);
                // SAFETY: `free` says the FRAME_ALIGN bytes at the head are
                // ours (the consumer reads nothing past the published head)
                // and they are contiguous (the head is FRAME_ALIGN-aligned
                // at a frame start, and slots are multiples of it). The
                // inline payload (len <= INLINE_MAX) fits in that line and
                // is readable per the `isend` contract.
                unsafe {
                    ptr::copy_nonoverlapping(hdr.as_ptr(), dst, HDR_BYTES);
                    if op.len <= INLINE_MAX && op.len > 0 {
                        ptr::copy_nonoverlapping(op.data, dst.add(HDR_BYTES), op.len);
                    }
                }
                prod.advance(FRAME_ALIGN);
                op.pos = FRAME_ALIGN;
                moved = true;
            }
            while op.pos < span {
                let free = prod.free(1).map_err(Fault::Corrupt)?;
                if free == 0 {
                    break;
                }
                let n = free.min(prod.contiguous()).min(span - op.pos);
                // Payload bytes sit at frame offsets FRAME_ALIGN.. (a frame
                // longer than one line never carries its payload inline).
                let p = op.pos - FRAME_ALIGN;
                if p < op.len {
                    let c = n.min(op.len - p);
                    // SAFETY: `n <= free` and `n <= contiguous()`, so the
                    // `c <= n` bytes at the head are ours to write; the
                    // source range `p..p+c` is inside the caller's buffer
                    // (`p + c <= len`), readable per the `isend` contract.
                    unsafe { ptr::copy_nonoverlapping(op.data.add(p), prod.head_ptr(), c) };
                }
                prod.advance(n);
                op.pos += n;
                moved = true;
            }
            if op.pos < span {
                break;
            }
            *ndone += 1;
        }
        prod.publish();
        Ok(moved)
    }

    /// Makes progress; records a fault if the receiver is gone while we
    /// wait for room.
    fn progress(&mut self) {
        if self.fault.is_some() || self.ndone == self.q.len() {
            return;
        }
        match self.pump() {
            Ok(true) => self.watch.progressed(),
            Ok(false) => {
                if self.watch.stalled(&self.seg.header().recv.0) {
                    // One last look: room may have appeared before it left.
                    match self.pump() {
                        Ok(true) => self.watch.progressed(),
                        Ok(false) => self.fail(Fault::Closed),
                        Err(f) => self.fail(f),
                    }
                }
            }
            Err(f) => self.fail(f),
        }
    }

    fn fail(&mut self, f: Fault) {
        tracing::warn!(peer_pid = self.watch.pid(), fault = ?f, "SHM: send failed");
        self.fault = Some(f);
    }

    fn pop_reported(&mut self) {
        while self.q.front().is_some_and(|op| op.reported) {
            self.q.pop_front();
            self.ndone -= 1;
        }
    }
}

impl Drop for ShmSendComm {
    fn drop(&mut self) {
        self.prod.publish();
        mark_closed(&self.seg.header().send.0);
    }
}

impl SendComm for ShmSendComm {
    fn reg_mr(&mut self, _ptr: *const u8, _len: usize) -> NetResult<MemHandle> {
        Ok(MemHandle(0))
    }

    fn dereg_mr(&mut self, _mr: MemHandle) -> NetResult<()> {
        Ok(())
    }

    unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: u32,
        _mr: Option<MemHandle>,
    ) -> NetResult<Option<Request>> {
        if let Some(f) = self.fault {
            return Err(f.to_error(self.watch.pid()));
        }
        if len > MAX_MESSAGE_BYTES {
            return Err(NetError::Other(format!(
                "SHM: send of {len} bytes exceeds the {MAX_MESSAGE_BYTES} byte limit"
            )));
        }
        if self.q.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.q.push_back(SendOp {
            id,
            data,
            len,
            tag,
            pos: 0,
            reported: false,
        });
        self.progress();
        Ok(Some(Request(id)))
    }

    fn test(&mut self, req: Request) -> NetResult<bool> {
        let idx = match self.q.binary_search_by_key(&req.0, |op| op.id) {
            Ok(i) if !self.q[i].reported => i,
            _ => return Err(unknown_request(req)),
        };
        self.progress();
        if idx < self.ndone {
            self.q[idx].reported = true;
            self.pop_reported();
            Ok(true)
        } else if let Some(f) = self.fault {
            Err(f.to_error(self.watch.pid()))
        } else {
            Ok(false)
        }
    }
}

struct RecvOp {
    id: u64,
    data: *mut u8,
    cap: usize,
    tag: u32,
    /// Message length, once the header has been read.
    len: usize,
    /// Bytes of the frame consumed so far (0 until the header is read).
    pos: usize,
    reported: bool,
}

/// The receiving half: the consumer of the ring.
pub(super) struct ShmRecvComm {
    cons: Consumer,
    watch: PeerWatch,
    q: VecDeque<RecvOp>,
    /// Number of completed requests at the front of `q`.
    ndone: usize,
    next_id: u64,
    fault: Option<Fault>,
    /// Declared last: the mapping outlives the ring pointers above.
    seg: Segment,
}

// SAFETY: as for ShmSendComm: the `irecv` contract keeps the buffers
// writable and unaliased until completion or drop, from any thread.
unsafe impl Send for ShmRecvComm {}

impl ShmRecvComm {
    /// A comm over an accepted segment; the sender is `peer_pid` in pid
    /// namespace `peer_pidns`.
    pub(super) fn new(seg: Segment, peer_pid: i32, peer_pidns: u64) -> ShmRecvComm {
        ShmRecvComm {
            cons: Consumer::new(ring_of(&seg)),
            watch: PeerWatch::new(peer_pid, peer_pidns),
            q: VecDeque::with_capacity(MAX_REQUESTS),
            ndone: 0,
            next_id: 1,
            fault: None,
            seg,
        }
    }

    /// Copies as much of the published stream as there are posted receives
    /// for. Returns whether any byte moved.
    fn pump(&mut self) -> Result<bool, Fault> {
        let ShmRecvComm { cons, q, ndone, .. } = self;
        let mut moved = false;
        let result = loop {
            let Some(op) = q.get_mut(*ndone) else {
                break Ok(());
            };
            if op.pos == 0 {
                match cons.avail(FRAME_ALIGN) {
                    Ok(a) if a >= FRAME_ALIGN => {}
                    Ok(_) => break Ok(()),
                    Err(e) => break Err(Fault::Corrupt(e)),
                }
                let src = cons.tail_ptr();
                let mut hdr = [0u8; HDR_BYTES];
                // SAFETY: a whole published line is at the tail (frames start
                // FRAME_ALIGN-aligned, so it is contiguous); the producer does
                // not touch it until we release it.
                unsafe { ptr::copy_nonoverlapping(src, hdr.as_mut_ptr(), HDR_BYTES) };
                let Some((tag, len)) = decode_header(&hdr) else {
                    break Err(Fault::Corrupt("bad frame header"));
                };
                if tag != op.tag {
                    break Err(Fault::Tag {
                        expected: op.tag,
                        got: tag,
                    });
                }
                let len = match usize::try_from(len) {
                    Ok(l) if l <= op.cap => l,
                    _ => {
                        break Err(Fault::Truncated {
                            posted: op.cap,
                            got: usize::try_from(len).unwrap_or(usize::MAX),
                        })
                    }
                };
                if len > MAX_MESSAGE_BYTES {
                    break Err(Fault::Corrupt("message larger than the transport allows"));
                }
                if len <= INLINE_MAX && len > 0 {
                    // SAFETY: the payload lies in the same published line;
                    // the destination holds `cap >= len` bytes, writable and
                    // unaliased per the `irecv` contract.
                    unsafe { ptr::copy_nonoverlapping(src.add(HDR_BYTES), op.data, len) };
                }
                cons.advance(FRAME_ALIGN);
                op.len = len;
                op.pos = FRAME_ALIGN;
                moved = true;
            }
            let span = frame_span(op.len).expect("len <= MAX_MESSAGE_BYTES");
            while op.pos < span {
                let avail = match cons.avail(1) {
                    Ok(a) => a,
                    Err(e) => return Err(Fault::Corrupt(e)),
                };
                if avail == 0 {
                    break;
                }
                let n = avail.min(cons.contiguous()).min(span - op.pos);
                let p = op.pos - FRAME_ALIGN;
                if p < op.len {
                    let c = n.min(op.len - p);
                    // SAFETY: `n <= avail` and `n <= contiguous()`, so the
                    // `c <= n` bytes at the tail are published and not
                    // overwritten until we release them; `p + c <= len <=
                    // cap`, inside the caller's writable buffer.
                    unsafe { ptr::copy_nonoverlapping(cons.tail_ptr(), op.data.add(p), c) };
                }
                cons.advance(n);
                op.pos += n;
                moved = true;
            }
            if op.pos < span {
                break Ok(());
            }
            *ndone += 1;
        };
        cons.publish();
        result.map(|()| moved)
    }

    /// Makes progress; records a fault if the sender is gone and nothing
    /// more is coming.
    fn progress(&mut self) {
        if self.fault.is_some() || self.ndone == self.q.len() {
            return;
        }
        match self.pump() {
            Ok(true) => self.watch.progressed(),
            Ok(false) => {
                if self.watch.stalled(&self.seg.header().send.0) {
                    // The sender published its last bytes before it set its
                    // flag (or died): drain them before reporting.
                    match self.pump() {
                        Ok(true) => self.watch.progressed(),
                        Ok(false) => self.fail(Fault::Closed),
                        Err(f) => self.fail(f),
                    }
                }
            }
            Err(f) => self.fail(f),
        }
    }

    fn fail(&mut self, f: Fault) {
        if let Fault::Closed | Fault::Corrupt(_) = f {
            tracing::warn!(peer_pid = self.watch.pid(), fault = ?f, "SHM: receive failed");
        }
        self.fault = Some(f);
    }

    fn pop_reported(&mut self) {
        while self.q.front().is_some_and(|op| op.reported) {
            self.q.pop_front();
            self.ndone -= 1;
        }
    }
}

impl Drop for ShmRecvComm {
    fn drop(&mut self) {
        self.cons.publish();
        mark_closed(&self.seg.header().recv.0);
    }
}

impl RecvComm for ShmRecvComm {
    fn reg_mr(&mut self, _ptr: *mut u8, _len: usize) -> NetResult<MemHandle> {
        Ok(MemHandle(0))
    }

    fn dereg_mr(&mut self, _mr: MemHandle) -> NetResult<()> {
        Ok(())
    }

    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: u32,
        _mr: Option<MemHandle>,
    ) -> NetResult<Option<Request>> {
        if let Some(f) = self.fault {
            return Err(f.to_error(self.watch.pid()));
        }
        if self.q.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.q.push_back(RecvOp {
            id,
            data,
            cap: len,
            tag,
            len: 0,
            pos: 0,
            reported: false,
        });
        Ok(Some(Request(id)))
    }

    fn test(&mut self, req: Request) -> NetResult<Option<usize>> {
        let idx = match self.q.binary_search_by_key(&req.0, |op| op.id) {
            Ok(i) if !self.q[i].reported => i,
            _ => return Err(unknown_request(req)),
        };
        self.progress();
        if idx < self.ndone {
            let op = &mut self.q[idx];
            op.reported = true;
            let size = op.len;
            self.pop_reported();
            Ok(Some(size))
        } else if let Some(f) = self.fault {
            Err(f.to_error(self.watch.pid()))
        } else {
            Ok(None)
        }
    }
}
