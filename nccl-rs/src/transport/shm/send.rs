//! The sending half: the producer of the ring.
//!
//! A message travels either through the ring (header, then the payload
//! copied slot by slot) or, when it is at least the single-copy threshold
//! long and the receiver's probe succeeded, as one descriptor line that the
//! receiver resolves with `process_vm_readv` (see [`super::cma`]), or with
//! `memcpy` from a mapping when the message lies in shared memory (see
//! [`super::mapped`]). A ring message is complete once its last byte is in
//! the ring; a single-copy one once the receiver has released its line.
//! While it waits for that, the sender helps copy the message if the
//! receiver offered it ([`super::split`]).

use super::cma::{self, CMA_NO, CMA_UNKNOWN, CMA_YES};
use super::comm::{copy_payload, mark_closed, ring_of, unknown_request, Fault};
use super::mapped::{MapSide, PeerMapping, SharedRegion, MAPPED_BYTES};
use super::peer::PeerWatch;
use super::ring::{
    encode_header, span_of, Payload, Producer, CMA_MAPPED, CMA_SENDER_HELPS, FRAME_ALIGN,
    HDR_BYTES, INLINE_MAX,
};
use super::segment::Segment;
use super::split::{self, HELP_FAILED, SPLIT_MIN_BYTES};
use super::{MAX_MESSAGE_BYTES, MAX_REQUESTS};
use nccl_net::{CopyHint, MemHandle, NetError, NetResult, Request, RequestQueue, SendComm};
use std::ptr;
use std::sync::atomic::Ordering;

mod eager;

/// The producer publishes its counter after every piece of this many
/// payload bytes, so the receiver copies a piece out while the next is
/// copied in. Publishing per piece instead of per slot lets a large
/// message's two copies overlap; the piece size itself matters little.
const PUBLISH_PIECE: usize = 16 << 10;

#[cfg(test)]
thread_local! {
    /// Payload bytes this thread wrote into a ring with streaming stores
    /// (tests check the path is taken).
    pub(super) static STREAMED_IN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Copies `len` bytes of a message into the ring at `dst`: with streaming
/// stores when the caller's plan says so ([`CopyHint::streaming_stores`]:
/// the receiver's CPU is apart from ours, and a plain store into a ring line
/// it read last lap would wait for that line), with `copy_mem` otherwise,
/// leaving the bytes in the cache the receiver reads them from.
///
/// # Safety
/// As [`copy_payload`].
unsafe fn copy_piece(src: *const u8, dst: *mut u8, len: usize, apart: bool) {
    // SAFETY: the caller's contract.
    let _streamed = unsafe { copy_payload(src, dst, len, apart) };
    #[cfg(test)]
    if _streamed {
        STREAMED_IN.set(STREAMED_IN.get() + len);
    }
}

struct SendOp {
    data: *const u8,
    len: usize,
    tag: u32,
    /// Chosen when the header is written.
    how: Payload,
    /// The caller's hint when it posted this message
    /// ([`SendComm::hint_copy`]).
    hint: CopyHint,
    /// Bytes of the frame written so far (0..=span).
    pos: usize,
    /// Stream position just past the frame, once its header is written.
    end: u64,
    /// Single-copy, and we said in its frame that we help copy it.
    helps: bool,
    /// Its ring pieces go with streaming stores (chosen with the header;
    /// see [`copy_piece`]).
    stream: bool,
}

/// The sending half: the producer of the ring.
pub(in crate::transport::shm) struct ShmSendComm {
    prod: Producer,
    watch: PeerWatch,
    q: RequestQueue<SendOp>,
    /// Number of requests at the front of `q` whose frames are written.
    nwritten: usize,
    /// Number of completed requests at the front of `q` (`<= nwritten`).
    ndone: usize,
    fault: Option<Fault>,
    /// Messages of at least this many bytes go single-copy once the
    /// receiver says it can (`None`: never).
    cma_min: Option<usize>,
    /// The receiver's probe outcome as last seen (`CMA_*`).
    cma: u32,
    /// The caller's last [`SendComm::hint_copy`] (initially single copy
    /// allowed, not idle).
    hint: CopyHint,
    /// Whether we copy parts of split messages into the receiver (we could
    /// read it at connect, and no write has failed).
    helps: bool,
    /// The split message we last reported on, and how many pieces of it we
    /// copied.
    helped: (u32, u32),
    /// Our mappings of the receiver's shared allocations (split messages
    /// into them are written by `memcpy`).
    maps: PeerMapping,
    /// Declared last: the mapping outlives the ring pointers above.
    seg: Segment,
}

// SAFETY: the raw pointers (the caller's send buffers, the mapping) are
// valid from any thread: the `isend` contract keeps the buffers readable
// until completion or drop, and the mapping lives as long as the comm.
unsafe impl Send for ShmSendComm {}

impl ShmSendComm {
    /// A comm over a segment whose sending side we have claimed; the
    /// receiver is `peer_pid` in pid namespace `peer_pidns`. Messages of at
    /// least `cma_min` bytes go single-copy when the receiver can read us
    /// and the caller's plan allows it; `helps`: we copy parts of the large
    /// ones the receiver offers.
    pub(in crate::transport::shm) fn new(
        seg: Segment,
        peer_pid: i32,
        peer_pidns: u64,
        cma_min: Option<usize>,
        helps: bool,
    ) -> ShmSendComm {
        ShmSendComm {
            prod: Producer::new(ring_of(&seg)),
            watch: PeerWatch::new(peer_pid, peer_pidns),
            q: RequestQueue::with_capacity(MAX_REQUESTS),
            nwritten: 0,
            ndone: 0,
            fault: None,
            cma_min,
            cma: if cma_min.is_some() {
                CMA_UNKNOWN
            } else {
                CMA_NO
            },
            hint: CopyHint {
                single_copy: true,
                ..CopyHint::default()
            },
            helps,
            helped: (0, 0),
            maps: PeerMapping::new(MapSide::Sender),
            seg,
        }
    }

    /// How the message of `len` bytes at `data`, posted with `hint`,
    /// travels now.
    fn payload_for(&mut self, data: *const u8, len: usize, hint: CopyHint) -> Payload {
        let Some(min) = self.cma_min else {
            return Payload::Ring;
        };
        if !hint.single_copy || len < min || len <= INLINE_MAX {
            return Payload::Ring;
        }
        if self.cma == CMA_UNKNOWN {
            // Acquire: pairs with the receiver's Release store after its
            // probe (nothing else is published with it; cheap either way).
            self.cma = self.seg.header().recv.0.cma.load(Ordering::Acquire);
        }
        if self.cma == CMA_YES && !self.ring_instead(data, len, hint) {
            Payload::Cma
        } else {
            Payload::Ring
        }
    }

    /// Whether a message that may go single copy goes through the ring
    /// instead: the caller's plan says so up to [`CopyHint::buffered_max`]
    /// bytes, except where the receiver would copy it by `memcpy` from
    /// shared memory ([`super::mapped`]) or we would help copy it
    /// ([`split`]), which beat the ring at any size.
    fn ring_instead(&self, data: *const u8, len: usize, hint: CopyHint) -> bool {
        len <= hint.buffered_max
            && !(self.helps && hint.sender_idle && len >= SPLIT_MIN_BYTES)
            && SharedRegion::locate(data, len).is_none()
    }

    /// Writes as much of the queued messages as the ring takes. Returns
    /// whether any byte moved.
    fn pump(&mut self) -> Result<bool, Fault> {
        let mut moved = false;
        while let Some(&SendOp {
            data,
            len,
            pos,
            how,
            hint,
            stream,
            ..
        }) = self.q.get(self.nwritten)
        {
            let (how, stream) = if pos == 0 {
                let how = self.payload_for(data, len, hint);
                (how, how == Payload::Ring && hint.streaming_stores)
            } else {
                (how, stream)
            };
            let i = self.nwritten;
            let ShmSendComm { prod, q, helps, .. } = self;
            let op = &mut q[i];
            let span = span_of(op.len, how).expect("isend checked the size");
            if op.pos == 0 {
                if prod.free(FRAME_ALIGN).map_err(Fault::Corrupt)? < FRAME_ALIGN {
                    break;
                }
                let dst = prod.head_ptr();
                let hdr = encode_header(op.tag, op.len as u64, how);
                // The single-copy descriptor: address, flags, and where a
                // message in shared memory lies ([`super::mapped`]).
                let mut desc = [0u8; FRAME_ALIGN - HDR_BYTES];
                desc[..8].copy_from_slice(&(op.data as u64).to_le_bytes());
                op.helps = how == Payload::Cma
                    && *helps
                    && op.hint.sender_idle
                    && op.len >= SPLIT_MIN_BYTES;
                let mut flags = if op.helps { CMA_SENDER_HELPS } else { 0 };
                if how == Payload::Cma {
                    if let Some(m) = SharedRegion::locate(op.data, op.len) {
                        flags |= CMA_MAPPED;
                        desc[16..16 + MAPPED_BYTES].copy_from_slice(&m.encode());
                    }
                }
                desc[8..12].copy_from_slice(&flags.to_le_bytes());
                // SAFETY: `free` says the FRAME_ALIGN bytes at the head are
                // ours (the consumer reads nothing past the published head)
                // and they are contiguous (the head is FRAME_ALIGN-aligned
                // at a frame start, and slots are multiples of it). The
                // inline payload (len <= INLINE_MAX) or the descriptor
                // fills at most the rest of that line after the header; the payload
                // is readable per the `isend` contract.
                unsafe {
                    ptr::copy_nonoverlapping(hdr.as_ptr(), dst, HDR_BYTES);
                    match how {
                        Payload::Cma => {
                            ptr::copy_nonoverlapping(desc.as_ptr(), dst.add(HDR_BYTES), desc.len())
                        }
                        Payload::Ring if op.len <= INLINE_MAX && op.len > 0 => {
                            ptr::copy_nonoverlapping(op.data, dst.add(HDR_BYTES), op.len)
                        }
                        Payload::Ring => {}
                    }
                }
                op.how = how;
                op.stream = stream;
                op.end = prod.position() + span as u64;
                prod.advance(FRAME_ALIGN);
                op.pos = FRAME_ALIGN;
                moved = true;
            }
            while op.pos < span {
                let free = prod.free(1).map_err(Fault::Corrupt)?;
                if free == 0 {
                    break;
                }
                let n = free
                    .min(prod.contiguous())
                    .min(span - op.pos)
                    .min(PUBLISH_PIECE);
                // Payload bytes sit at frame offsets FRAME_ALIGN.. (a frame
                // longer than one line never carries its payload inline).
                let p = op.pos - FRAME_ALIGN;
                if p < op.len {
                    let c = n.min(op.len - p);
                    // SAFETY: `n <= free` and `n <= contiguous()`, so the
                    // `c <= n` bytes at the head are ours to write; the
                    // source range `p..p+c` is inside the caller's buffer
                    // (`p + c <= len`), readable per the `isend` contract.
                    unsafe { copy_piece(op.data.add(p), prod.head_ptr(), c, op.stream) };
                }
                prod.advance(n);
                // Publish piece by piece, so the receiver copies out the
                // first piece while we copy in the next.
                prod.publish();
                op.pos += n;
                moved = true;
            }
            if op.pos < span {
                break;
            }
            self.nwritten += 1;
        }
        self.prod.publish();
        Ok(moved)
    }

    /// Advances `ndone` over written requests that are complete: ring
    /// messages at once, single-copy ones once the receiver released their
    /// line; helps copy the first one still being read. Returns whether any
    /// completed or we copied anything.
    fn settle(&mut self) -> Result<bool, Fault> {
        let before = self.ndone;
        let mut consumed = None;
        let mut helped = false;
        while self.ndone < self.nwritten {
            let op = &self.q[self.ndone];
            let (how, end, helps) = (op.how, op.end, op.helps);
            if how == Payload::Cma {
                let t = match consumed {
                    Some(t) => t,
                    None => *consumed.insert(self.prod.consumed().map_err(Fault::Corrupt)?),
                };
                if t < end {
                    if helps && self.helps {
                        helped = self.help(self.ndone);
                    }
                    break;
                }
            }
            self.ndone += 1;
        }
        Ok(self.ndone != before || helped)
    }

    /// Copies the pieces we can claim of the single-copy message `q[i]`, if
    /// the receiver has offered it ([`super::split`]), into the receiver's
    /// buffer, and reports them. Returns whether we copied any.
    fn help(&mut self, i: usize) -> bool {
        let op = &self.q[i];
        let (data, len) = (op.data, op.len);
        // A single-copy frame is one line, starting a line before its end.
        let epoch = split::epoch_of(op.end - FRAME_ALIGN as u64);
        let hdr = self.seg.header();
        let mut moved = false;
        while let Some(run) = hdr.offer.0.claim_back(epoch, len) {
            let (lo, hi) = (run.lo, run.hi);
            let (start, n) = split::bytes_of(lo, hi, run.piece, len);
            let pid = self.watch.pid();
            let mapped = run.shared.and_then(|at| self.maps.resolve(pid, &at, len));
            let wrote = match mapped {
                // SAFETY: `p` is our mapping of the receiver's allocation,
                // covering its whole destination of `len` bytes (bounds
                // checked by `resolve`; the file's size is sealed), and
                // `start + n <= len`. The receiver touches pieces `[lo, hi)`
                // only after our report below (Release/Acquire), and keeps
                // the destination until then (a withdrawal waits for us).
                // The source lies in the caller's buffer, readable per the
                // `isend` contract until completion, which waits for the
                // receiver to see the report. `copy`: no overlap is assumed.
                Some(p) => unsafe {
                    crate::reduce::move_mem(data.add(start), p.add(start), n);
                    Ok(())
                },
                // SAFETY: as above for the source; the kernel checks the
                // receiver's range.
                None => unsafe {
                    cma::write(pid, data.add(start), run.dst.wrapping_add(start as u64), n)
                },
            };
            if self.helped.0 != epoch {
                self.helped = (epoch, 0);
            }
            let report = match wrote {
                Ok(()) => {
                    self.helped.1 += u32::from(hi - lo);
                    self.helped.1
                }
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(libc::EIO);
                    tracing::warn!(peer_pid = self.watch.pid(), error = %e,
                        "SHM: writing part of a split message into the receiver failed; not helping again");
                    self.helps = false;
                    HELP_FAILED | (errno as u32 & !HELP_FAILED)
                }
            };
            // Release: our write is over before the receiver sees the count.
            hdr.helped
                .0
                .store(split::helped_word(epoch, report), Ordering::Release);
            if !self.helps {
                break;
            }
            moved = true;
        }
        moved
    }

    /// Makes progress; records a fault if the receiver is gone while we
    /// wait for room or for it to read.
    fn progress(&mut self) {
        if self.fault.is_some() || self.ndone == self.q.len() {
            return;
        }
        let step = |c: &mut Self| -> Result<bool, Fault> { Ok(c.pump()? | c.settle()?) };
        let stepped = step(self);
        match stepped {
            Ok(true) => self.watch.progressed(),
            Ok(false) => {
                if self.watch.stalled(&self.seg.header().recv.0) {
                    // One last look: it may have made room or read before
                    // it left.
                    match step(self) {
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
}

impl Drop for ShmSendComm {
    fn drop(&mut self) {
        self.prod.publish();
        // Release: a receiver that sees the flag after a single-copy read
        // knows our buffers may have gone (see `ShmRecvComm`).
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
        if self.q.is_full() {
            return Ok(None);
        }
        let req = self.q.push(SendOp {
            data,
            len,
            tag,
            how: Payload::Ring,
            hint: self.hint,
            pos: 0,
            end: 0,
            helps: false,
            stream: false,
        });
        self.progress();
        Ok(Some(req))
    }

    fn test(&mut self, req: Request) -> NetResult<bool> {
        let idx = self.q.live(req).ok_or_else(|| unknown_request(req))?;
        self.progress();
        if idx < self.ndone {
            let popped = self.q.report(idx);
            self.ndone -= popped;
            self.nwritten -= popped;
            Ok(true)
        } else if let Some(f) = self.fault {
            Err(f.to_error(self.watch.pid()))
        } else {
            Ok(false)
        }
    }

    fn hint_copy(&mut self, hint: CopyHint) {
        self.hint = hint;
    }

    fn eager_max(&self) -> usize {
        self.eager_limit()
    }

    unsafe fn send_eager(&mut self, data: *const u8, len: usize, tag: u32) -> NetResult<bool> {
        // SAFETY: the caller upholds the same contract.
        unsafe { self.eager(data, len, tag) }
    }
}
