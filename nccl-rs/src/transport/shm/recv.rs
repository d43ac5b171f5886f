//! The receiving half: the consumer of the ring.
//!
//! Ring frames are copied out of the ring into the posted buffer as they
//! are published. A single-copy frame (see [`super::cma`]) is resolved with
//! one `process_vm_readv` from the sender's buffer straight into the posted
//! buffer, or one `memcpy` from our mapping of it when it lies in the
//! sender's shared memory ([`super::mapped`]); its line is released only
//! after the read, which is what completes the sender's request. A large
//! one is offered for splitting when the sender helps: both ends copy parts
//! of it ([`super::split`]).

use super::cma;
use super::comm::{copy_payload, mark_closed, ring_of, unknown_request, Fault};
use super::mapped::{MapSide, PeerMapping, SharedRegion, MAPPED_BYTES};
use super::peer::{pid_alive, PeerWatch};
use super::ring::{
    decode_header, span_of, Consumer, Payload, CMA_MAPPED, CMA_SENDER_HELPS, FRAME_ALIGN,
    HDR_BYTES, INLINE_MAX,
};
use super::segment::Segment;
use super::split::SPLIT_MIN_BYTES;
use split_recv::OpenSplit;

mod eager;
mod split_recv;
use super::{MAX_MESSAGE_BYTES, MAX_REQUESTS};
use nccl_net::{
    MemHandle, NetError, NetResult, Received, RecvComm, RecvHint, Request, RequestQueue,
};
use std::ptr;
use std::sync::atomic::Ordering;

struct RecvOp {
    data: *mut u8,
    cap: usize,
    tag: u32,
    /// Message length, once the header has been read.
    len: usize,
    /// Stream bytes of its frame, once the header has been read.
    span: usize,
    /// Bytes of the frame consumed so far (0 until the header is read).
    pos: usize,
    /// Posted with `irecv_lend`: a ring payload that fits the ring is lent
    /// in place instead of copied.
    lend: bool,
    /// The lent pieces, once complete that way.
    lent: Option<[(*const u8, usize); 2]>,
    /// Copied in with streaming stores (the buffer lies in the caller's
    /// [`RecvHint::stream`] range).
    stream: bool,
}

/// The receiving half: the consumer of the ring.
pub(in crate::transport::shm) struct ShmRecvComm {
    cons: Consumer,
    watch: PeerWatch,
    q: RequestQueue<RecvOp>,
    /// Number of completed requests at the front of `q`.
    ndone: usize,
    fault: Option<Fault>,
    /// Whether we told the sender it may send single-copy frames.
    cma_ok: bool,
    /// Whether `irecv_lend` may lend (else it copies like `irecv`).
    may_lend: bool,
    /// Whether the sender helps copy split messages.
    split: bool,
    /// The split message being copied: the frame at the tail, for the
    /// first queued request.
    open: Option<OpenSplit>,
    /// A lent payload not released yet: `(request id, stream bytes)`. No
    /// later frame is read meanwhile.
    lent: Option<(u64, usize)>,
    /// Our mappings of the sender's shared allocations.
    maps: PeerMapping,
    /// The caller's last [`RecvComm::hint_recv`].
    hint: RecvHint,
    /// Declared last: the mapping outlives the ring pointers above.
    seg: Segment,
}

// SAFETY: as for ShmSendComm: the `irecv` contract keeps the buffers
// writable and unaliased until completion or drop, from any thread.
unsafe impl Send for ShmRecvComm {}

/// What the header line at the tail says, checked against the receive
/// posted for it: `(len, how, sender address, the sender helps copy it,
/// the shared allocation it lies in)`.
type Frame = (usize, Payload, u64, bool, Option<SharedRegion>);

/// Where a single-copy message's bytes are read from.
#[derive(Clone, Copy, Debug)]
pub(super) enum Src {
    /// This address in the sender: `process_vm_readv`.
    Remote(u64),
    /// This address in our mapping of the sender's shared allocation.
    Local(*const u8),
}

impl Src {
    /// The source of the message's bytes from `at` on.
    pub(super) fn offset(self, at: usize) -> Src {
        match self {
            Src::Remote(a) => Src::Remote(a.wrapping_add(at as u64)),
            Src::Local(p) => Src::Local(p.wrapping_add(at)),
        }
    }
}

impl ShmRecvComm {
    /// A comm over an accepted segment; the sender is `peer_pid` in pid
    /// namespace `peer_pidns`; `cma_ok`: whether the probe succeeded and we
    /// published that; `split`: whether the sender helps copy large
    /// single-copy messages; `may_lend`: whether `irecv_lend` lends.
    pub(in crate::transport::shm) fn new(
        seg: Segment,
        peer_pid: i32,
        peer_pidns: u64,
        cma_ok: bool,
        split: bool,
        may_lend: bool,
    ) -> ShmRecvComm {
        ShmRecvComm {
            cons: Consumer::new(ring_of(&seg)),
            watch: PeerWatch::new(peer_pid, peer_pidns),
            q: RequestQueue::with_capacity(MAX_REQUESTS),
            ndone: 0,
            fault: None,
            cma_ok,
            may_lend,
            split,
            open: None,
            lent: None,
            maps: PeerMapping::new(MapSide::Receiver),
            hint: RecvHint::default(),
            seg,
        }
    }

    /// Reads and checks the header line at the tail for `op`, copying an
    /// inline payload. The caller has checked that a whole line is
    /// published.
    fn read_header(&self, op: &RecvOp) -> Result<Frame, Fault> {
        let src = self.cons.tail_ptr();
        let mut line = [0u8; FRAME_ALIGN];
        // SAFETY: a whole published line is at the tail (frames start
        // FRAME_ALIGN-aligned, so it is contiguous); the producer does not
        // touch it until we release it.
        unsafe { ptr::copy_nonoverlapping(src, line.as_mut_ptr(), line.len()) };
        let hdr: &[u8; HDR_BYTES] = line[..HDR_BYTES].try_into().expect("16 bytes");
        let Some((tag, len, how)) = decode_header(hdr) else {
            return Err(Fault::Corrupt("bad frame header"));
        };
        if tag != op.tag {
            return Err(Fault::Tag {
                expected: op.tag,
                got: tag,
            });
        }
        let len = match usize::try_from(len) {
            Ok(l) if l <= op.cap => l,
            _ => {
                return Err(Fault::Truncated {
                    posted: op.cap,
                    got: usize::try_from(len).unwrap_or(usize::MAX),
                })
            }
        };
        if len > MAX_MESSAGE_BYTES {
            return Err(Fault::Corrupt("message larger than the transport allows"));
        }
        if how == Payload::Cma && !self.cma_ok {
            return Err(Fault::Corrupt(
                "single-copy frame on a ring-only connection",
            ));
        }
        if how == Payload::Ring && len <= INLINE_MAX && len > 0 {
            // SAFETY: the payload lies in the same published line; the
            // destination holds `cap >= len` bytes, writable and unaliased
            // per the `irecv` contract.
            unsafe { ptr::copy_nonoverlapping(src.add(HDR_BYTES), op.data, len) };
        }
        let desc = &line[HDR_BYTES..];
        let addr = u64::from_le_bytes(desc[..8].try_into().expect("8 bytes"));
        let flags = u32::from_le_bytes(desc[8..12].try_into().expect("4 bytes"));
        let helps = how == Payload::Cma && flags & CMA_SENDER_HELPS != 0;
        let mapped = (how == Payload::Cma && flags & CMA_MAPPED != 0).then(|| {
            SharedRegion::decode(desc[16..16 + MAPPED_BYTES].try_into().expect("descriptor"))
        });
        Ok((len, how, addr, helps, mapped))
    }

    /// Copies `len` bytes of the sender's at `src` into `op`'s buffer from
    /// offset `at`.
    fn read_peer(&self, op: &RecvOp, at: usize, len: usize, src: Src) -> Result<(), Fault> {
        let pid = self.watch.pid();
        let dst = op.data.wrapping_add(at);
        match src {
            // SAFETY: `at + len <= cap` (callers read within the message,
            // which fits): the destination is writable and unaliased per
            // the `irecv` contract.
            Src::Remote(addr) => match unsafe { cma::read(pid, dst, addr, len) } {
                Ok(()) => {}
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(libc::EIO);
                    if errno == libc::ESRCH || !pid_alive(pid) {
                        return Err(Fault::Closed);
                    }
                    return Err(Fault::Cma(errno));
                }
            },
            // SAFETY: the destination as above; the source lies in our
            // mapping of the sender's allocation (`PeerMapping::resolve`
            // checked that the message fits it; callers read within the
            // message), which stays mapped while we hold it, whatever the
            // sender does. `copy` tolerates a destination in the same pages;
            // a streaming copy is only taken where the two are apart.
            Src::Local(p) => unsafe {
                match op.stream && crate::reduce::disjoint(p, dst, len) {
                    true => copy_out(p, dst, len, true),
                    false => crate::reduce::move_mem(p, dst, len),
                }
            },
        }
        // Acquire: the sender sets `closed` (Release) when its comm is
        // dropped, and its buffers may be freed after that. Not set now
        // means it was not set during the read either, so the bytes we
        // read were the message.
        if self.seg.header().send.0.closed.load(Ordering::Acquire) != 0 {
            return Err(Fault::Closed);
        }
        Ok(())
    }

    /// Receives as much of the published stream as there are posted
    /// receives for. Returns whether any byte moved.
    fn pump(&mut self) -> Result<bool, Fault> {
        let mut moved = false;
        let result = loop {
            if self.lent.is_some() {
                break Ok(());
            }
            let i = self.ndone;
            let Some(op) = self.q.get(i) else {
                break Ok(());
            };
            if op.pos == 0 {
                let (len, how) = match self.start_frame(i, &mut moved) {
                    Ok(Some(f)) => f,
                    Ok(None) => break Ok(()),
                    Err(f) => break Err(f),
                };
                self.cons.advance(FRAME_ALIGN);
                let op = &mut self.q[i];
                op.len = len;
                op.span = span_of(len, how).expect("len <= MAX_MESSAGE_BYTES");
                op.pos = FRAME_ALIGN;
                moved = true;
            }
            let ShmRecvComm { cons, q, lent, .. } = self;
            let id = q.id_at(i);
            let op = &mut q[i];
            let rest = op.span - op.pos;
            // A ring payload (not inline, not single-copy: those frames are
            // one line) that fits the ring.
            let ring_payload = op.len > INLINE_MAX && op.span > FRAME_ALIGN;
            if op.lend && ring_payload && op.pos == FRAME_ALIGN && op.span <= cons.capacity() {
                // Lend the payload where it lies once all of it is
                // published; it fits the ring, so the producer can publish
                // it all while we hold the lines before it released.
                match cons.avail(rest) {
                    Ok(a) if a >= rest => {}
                    Ok(_) => break Ok(()),
                    Err(e) => break Err(Fault::Corrupt(e)),
                }
                let [a, b] = cons.peek(op.len);
                op.lent = Some([a, b]);
                op.pos = op.span;
                *lent = Some((id, rest));
                self.ndone += 1;
                moved = true;
                break Ok(());
            }
            while op.pos < op.span {
                let avail = match cons.avail(1) {
                    Ok(a) => a,
                    Err(e) => return Err(Fault::Corrupt(e)),
                };
                if avail == 0 {
                    break;
                }
                let n = avail.min(cons.contiguous()).min(op.span - op.pos);
                let p = op.pos - FRAME_ALIGN;
                if p < op.len {
                    let c = n.min(op.len - p);
                    // SAFETY: `n <= avail` and `n <= contiguous()`, so the
                    // `c <= n` bytes at the tail are published and not
                    // overwritten until we release them; `p + c <= len <=
                    // cap`, inside the caller's writable buffer, which
                    // nobody else touches (the `irecv` contract) and which
                    // does not overlap the ring.
                    unsafe { copy_out(cons.tail_ptr(), op.data.add(p), c, op.stream) };
                }
                cons.advance(n);
                op.pos += n;
                moved = true;
            }
            if op.pos < op.span {
                break Ok(());
            }
            self.ndone += 1;
        };
        // Release: the single-copy reads above are over before the sender
        // sees their lines released.
        self.cons.publish();
        result.map(|()| moved)
    }

    /// Reads the frame at the tail for request `i` and, for a single-copy
    /// frame, copies the message (or, split, our next part of it). Returns
    /// its `(len, how)` once the payload is in or follows in the ring;
    /// `None` while the header is not published or a split is not done.
    fn start_frame(
        &mut self,
        i: usize,
        moved: &mut bool,
    ) -> Result<Option<(usize, Payload)>, Fault> {
        if let Some(s) = self.open {
            return self.split_step(i, s, moved);
        }
        if self.cons.avail(FRAME_ALIGN).map_err(Fault::Corrupt)? < FRAME_ALIGN {
            return Ok(None);
        }
        let (len, how, addr, helps, mapped) = self.read_header(&self.q[i])?;
        if how != Payload::Cma {
            return Ok(Some((len, how)));
        }
        let src = mapped
            .and_then(|m| self.maps.resolve(self.watch.pid(), &m, len))
            .map_or(Src::Remote(addr), |p| Src::Local(p.cast_const()));
        // Release the frames before this one first: the sender completes
        // them (and helps with this one only once they are complete).
        self.cons.publish();
        if !(self.split && helps) || len < SPLIT_MIN_BYTES {
            self.read_peer(&self.q[i], 0, len, src)?;
            return Ok(Some((len, how)));
        }
        self.open_split(i, len, src, moved)
    }

    /// Makes progress; records a fault if the sender is gone and nothing
    /// more is coming.
    fn progress(&mut self) {
        // While a payload is lent nothing can move, and that stall is ours,
        // not the sender's.
        if self.fault.is_some() || self.ndone == self.q.len() || self.lent.is_some() {
            return;
        }
        let pumped = self.pump();
        match pumped {
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
        if let Fault::Closed | Fault::Corrupt(_) | Fault::Cma(_) | Fault::Helper(_) = f {
            tracing::warn!(peer_pid = self.watch.pid(), fault = ?f, "SHM: receive failed");
        }
        self.fault = Some(f);
    }
}

impl Drop for ShmRecvComm {
    fn drop(&mut self) {
        self.withdraw();
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
        self.post(data, len, tag, false)
    }

    unsafe fn irecv_lend(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: u32,
        _mr: Option<MemHandle>,
    ) -> NetResult<Option<Request>> {
        self.post(data, len, tag, self.may_lend)
    }

    fn test(&mut self, req: Request) -> NetResult<Option<usize>> {
        match self.test_any(req)? {
            None => Ok(None),
            Some(Received::Copied(n)) => Ok(Some(n)),
            Some(Received::Lent { .. }) => Err(NetError::Other(format!(
                "SHM: request {} was lent: test it with test_lend and release it",
                req.0
            ))),
        }
    }

    fn test_lend(&mut self, req: Request) -> NetResult<Option<Received>> {
        self.test_any(req)
    }

    fn release(&mut self, req: Request) -> NetResult<()> {
        match self.lent {
            Some((id, n)) if id == req.0 => {
                self.cons.advance(n);
                // Release: our reads of the lent bytes are over before the
                // producer sees them free.
                self.cons.publish();
                self.lent = None;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn hint_recv(&mut self, hint: RecvHint) {
        self.hint = hint;
    }

    fn eager_max(&self) -> usize {
        self.eager_limit()
    }

    unsafe fn recv_eager(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: u32,
    ) -> NetResult<Option<usize>> {
        // SAFETY: the caller upholds the same contract.
        unsafe { self.eager(data, len, tag) }
    }
}

#[cfg(test)]
thread_local! {
    /// Bytes this thread copied into receive buffers with streaming stores
    /// (tests check where the path is taken).
    pub(super) static STREAMED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Copies `len` bytes from `src` into a receive buffer at `dst`, with
/// streaming stores where `stream` says the caller will not read it soon.
///
/// # Safety
/// As [`copy_payload`].
unsafe fn copy_out(src: *const u8, dst: *mut u8, len: usize, stream: bool) {
    // SAFETY: the caller's contract.
    let _streamed = unsafe { copy_payload(src, dst, len, stream) };
    #[cfg(test)]
    if _streamed {
        STREAMED.set(STREAMED.get() + len);
    }
}

impl ShmRecvComm {
    fn post(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: u32,
        lend: bool,
    ) -> NetResult<Option<Request>> {
        if let Some(f) = self.fault {
            return Err(f.to_error(self.watch.pid()));
        }
        if self.q.is_full() {
            return Ok(None);
        }
        let req = self.q.push(RecvOp {
            data,
            cap: len,
            tag,
            len: 0,
            span: 0,
            pos: 0,
            lend,
            lent: None,
            stream: self.hint.streams(data, len),
        });
        Ok(Some(req))
    }

    fn test_any(&mut self, req: Request) -> NetResult<Option<Received>> {
        let idx = self.q.live(req).ok_or_else(|| unknown_request(req))?;
        self.progress();
        if idx < self.ndone {
            let op = &self.q[idx];
            let got = match op.lent {
                Some([first, second]) => Received::Lent { first, second },
                None => Received::Copied(op.len),
            };
            let popped = self.q.report(idx);
            self.ndone -= popped;
            Ok(Some(got))
        } else if let Some(f) = self.fault {
            Err(f.to_error(self.watch.pid()))
        } else {
            Ok(None)
        }
    }
}
