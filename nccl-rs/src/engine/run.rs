//! One operation in flight: posts receives ahead, executes steps in order,
//! reduces, forwards, and tracks outstanding sends.
//!
//! # Memory discipline
//! Receives are posted up to `window` steps ahead of the executing step,
//! straight into their destination (or into a staging slot when the data is
//! to be reduced). Sends are posted when their step executes and complete in
//! the background. Schedules are written so that a posted receive's memory
//! is written only when its data arrives, and that data arrives only after
//! every earlier local use of that memory has been sent on (causality along
//! the ring); the engine itself only touches memory of the step it executes.

use super::{CallBufs, Region};
use crate::datatype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::observe::telemetry::{ErrorKind, Telemetry, Wait};
use crate::profiler::{Sent, Trace};
use crate::reduce;
use crate::schedule::{Loc, Schedule, Step};
use crate::transport::{NetError, RecvComm, Request, SendComm};
use nccl_net::Received;
use std::collections::VecDeque;

/// What one operation is.
pub(crate) struct Call<'a> {
    pub(crate) sched: &'a Schedule,
    pub(crate) dtype: DataType,
    pub(crate) op: RedOp,
    pub(crate) tag: u32,
    /// For error messages.
    pub(crate) what: super::OpLabel,
    /// How its messages travel (the call plan's; see `plan::call`).
    pub(crate) hints: Hints,
}

/// What the transports are told about a call's messages before it starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hints {
    pub(crate) send: crate::transport::CopyHint,
    pub(crate) recv: crate::transport::RecvHint,
    /// Local copies (a rank's own block) use streaming stores.
    pub(crate) stream_copies: bool,
}

pub(super) struct Posted {
    req: Request,
    slot: Option<usize>,
}

/// Per-run bookkeeping kept by the engine between runs so a call allocates
/// nothing once warm.
#[derive(Default)]
pub(super) struct Bookkeeping {
    posted: Vec<Option<Posted>>,
    sends: VecDeque<(usize, Request)>,
    free_slots: Vec<usize>,
}

impl Bookkeeping {
    /// Ready for a run of `steps` steps with `slots` staging slots, all
    /// free (out of line: the eager path skips it).
    #[inline(never)]
    fn reset(&mut self, steps: usize, slots: usize) {
        self.posted.clear();
        self.posted.resize_with(steps, || None);
        self.free_slots.clear();
        self.free_slots.extend((0..slots).rev());
    }
}

/// The state of one operation in flight.
pub(crate) struct Run<'a> {
    rank: usize,
    nranks: usize,
    send: &'a mut [Option<Box<dyn SendComm>>],
    recv: &'a mut [Option<Box<dyn RecvComm>>],
    call: Call<'a>,
    bufs: CallBufs,
    scratch: Region,
    slots: &'a [Region],
    free_slots: &'a mut Vec<usize>,
    posted: &'a mut Vec<Option<Posted>>,
    next_post: usize,
    cur: usize,
    window: usize,
    sends: &'a mut VecDeque<(usize, Request)>,
    /// A send the transport had no room for yet; retried before any
    /// further step executes, so per-peer order is kept.
    blocked: Option<(usize, Region)>,
    /// The engine's abort flag (borrowed: no reference count per call).
    abort: &'a super::AbortHandle,
    /// Every message fits the transports' eager paths (the engine's
    /// `eager` check): steps run in order, each receive read when its step
    /// comes, each send complete when written; nothing is posted or tested.
    eager: bool,
    /// Per-peer counters, and whether this run is control traffic.
    tel: &'a Telemetry,
    control: bool,
    /// The profiler's events of this call (`None`: no plugin).
    trace: Option<&'a mut Trace>,
}

impl<'a> Run<'a> {
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn new(
        rank: usize,
        nranks: usize,
        send: &'a mut [Option<Box<dyn SendComm>>],
        recv: &'a mut [Option<Box<dyn RecvComm>>],
        call: Call<'a>,
        bufs: CallBufs,
        scratch: Region,
        slots: &'a [Region],
        book: &'a mut Bookkeeping,
        abort: &'a super::AbortHandle,
        eager: bool,
        (tel, control): (&'a Telemetry, bool),
        trace: Option<&'a mut Trace>,
    ) -> Run<'a> {
        let n = call.sched.steps.len();
        let window = 2 * slots.len().max(1);
        book.sends.clear();
        if !eager {
            // (The eager path posts nothing and reduces in slot 0.)
            book.reset(n, slots.len());
        }
        Run {
            rank,
            nranks,
            send,
            recv,
            free_slots: &mut book.free_slots,
            slots,
            call,
            bufs,
            scratch,
            posted: &mut book.posted,
            // Nothing is posted on the eager path: every step may run.
            next_post: if eager { n } else { 0 },
            cur: 0,
            window,
            sends: &mut book.sends,
            blocked: None,
            abort,
            eager,
            tel,
            control,
            trace,
        }
    }

    /// The communicator's per-peer counters.
    pub(crate) fn telemetry(&self) -> &Telemetry {
        self.tel
    }

    /// What this run waits on when a poll moves nothing: a parked send's
    /// peer, else the current step's sender, else a send still draining.
    pub(crate) fn waits_on(&self) -> Option<Wait> {
        if let Some((to, _)) = self.blocked {
            return Some(Wait::Send(to));
        }
        let step = self.call.sched.steps.get(self.cur);
        if let Some(from) = step.and_then(Step::recv_peer) {
            return Some(Wait::Recv(from));
        }
        self.sends.front().map(|s| Wait::Send(s.0))
    }

    /// Whether the communicator was aborted.
    pub(crate) fn aborted(&self) -> bool {
        self.abort.is_aborted()
    }

    #[cold]
    fn net_err(&self, peer: usize, source: NetError) -> Error {
        self.tel.error(peer, ErrorKind::of(&source));
        Error::Transport {
            rank: self.rank,
            peer,
            op: self.call.what.to_string(),
            source,
        }
    }

    #[cold]
    fn internal(&self, msg: String) -> Error {
        Error::Internal {
            rank: self.rank,
            msg: format!("{}: {msg}", self.call.what),
        }
    }

    fn bytes(&self, count: usize) -> usize {
        count * self.call.dtype.size()
    }

    /// The memory of `count` elements at `loc`, bounds-checked.
    fn region(&self, loc: Loc, count: usize) -> Result<Region> {
        let es = self.call.dtype.size();
        let (base, off) = match loc {
            Loc::In(o) => (self.bufs.input, o),
            Loc::Out(o) => (self.bufs.output, o),
            Loc::Scratch(o) => (self.scratch, o),
            Loc::Group(b, o) => {
                let r = self
                    .bufs
                    .group
                    .get(b)
                    .ok_or_else(|| self.internal(format!("no group buffer {b}")))?;
                (*r, o)
            }
        };
        let (start, len) = (off * es, count * es);
        if start.checked_add(len).is_none_or(|end| end > base.len) {
            return Err(self.internal(format!(
                "{loc:?}+{count} exceeds a buffer of {} bytes",
                base.len
            )));
        }
        // `wrapping_add` keeps this free of unsafe; the bounds were checked above.
        Ok(Region::new(base.ptr.wrapping_add(start), len))
    }

    /// Peers this operation is still waiting for, for timeout messages.
    pub(crate) fn waiting_for(&self) -> String {
        let mut parts = Vec::new();
        if let Some(from) = self
            .call
            .sched
            .steps
            .get(self.cur)
            .and_then(Step::recv_peer)
        {
            parts.push(format!(
                "data from rank {from} (step {} of {})",
                self.cur,
                self.call.sched.steps.len()
            ));
        }
        let mut peers: Vec<usize> = self.sends.iter().map(|s| s.0).collect();
        peers.sort_unstable();
        peers.dedup();
        if !peers.is_empty() {
            parts.push(format!("sends to ranks {peers:?} to drain"));
        }
        parts.join(" and ")
    }

    /// Where this operation stands: its step, and the peer it waits on
    /// (the current step's data, else a parked send, else sends in flight).
    pub(crate) fn wait_point(&self) -> crate::observe::progress::WaitPoint {
        use crate::observe::progress::WaitKind;
        let steps = &self.call.sched.steps;
        let on = match steps.get(self.cur).and_then(Step::recv_peer) {
            Some(from) => Some((from, WaitKind::Recv)),
            None => self
                .blocked
                .map(|b| b.0)
                .or_else(|| self.sends.front().map(|s| s.0))
                .map(|to| (to, WaitKind::Send)),
        };
        crate::observe::progress::WaitPoint {
            step: self.cur,
            steps: steps.len(),
            on,
        }
    }

    /// Makes as much progress as possible without blocking. Returns
    /// `(done, moved)`.
    pub(crate) fn poll(&mut self) -> Result<(bool, bool)> {
        let mut moved = self.post_receives()?;
        moved |= self.test_sends()?;
        moved |= self.execute()?;
        let done = self.cur == self.call.sched.steps.len()
            && self.sends.is_empty()
            && self.blocked.is_none();
        Ok((done, moved))
    }

    fn post_receives(&mut self) -> Result<bool> {
        let mut moved = false;
        let steps = &self.call.sched.steps;
        while self.next_post < steps.len() && self.next_post < self.cur + self.window {
            let step = steps[self.next_post];
            if let Some(from) = step.recv_peer() {
                let bytes = self.bytes(step.count());
                let (dst, slot) = if step.needs_slot() {
                    let Some(&slot) = self.free_slots.last() else {
                        break;
                    };
                    (Region::new(self.slots[slot].ptr, bytes), Some(slot))
                } else {
                    let dst = match step {
                        Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => dst,
                        _ => return Err(self.internal(format!("step {step:?} has no destination"))),
                    };
                    (self.region(dst, step.count())?, None)
                };
                let tag = self.call.tag;
                let comm = self.recv.get_mut(from).and_then(Option::as_mut);
                let Some(comm) = comm else {
                    return Err(self.internal(format!("no connection from rank {from}")));
                };
                let net = self.trace.as_deref_mut().and_then(|t| t.net_recv(from));
                if net.is_some() {
                    comm.profile(net);
                }
                // SAFETY: `dst` is a checked range of a user buffer or of a
                // staging slot that stays allocated for the whole run, and
                // nothing accesses it until this request completes (see the
                // module docs for the causality argument). Data to be reduced
                // is read once, so the transport may lend it in place.
                let req = unsafe {
                    if slot.is_some() {
                        comm.irecv_lend(dst.ptr, dst.len, tag, None)
                    } else {
                        comm.irecv(dst.ptr, dst.len, tag, None)
                    }
                };
                let req = match req {
                    Ok(Some(r)) => r,
                    Ok(None) => {
                        if net.is_some() {
                            comm.profile(None);
                        }
                        break;
                    }
                    Err(e) => return Err(self.net_err(from, e)),
                };
                if slot.is_some() {
                    self.free_slots.pop();
                }
                self.posted[self.next_post] = Some(Posted { req, slot });
                if let Some(t) = self.trace.as_deref_mut() {
                    t.recv_posted(from, bytes);
                }
            }
            self.next_post += 1;
            moved = true;
        }
        Ok(moved)
    }

    fn test_sends(&mut self) -> Result<bool> {
        let before = self.sends.len();
        let mut i = 0;
        while i < self.sends.len() {
            let (peer, req) = self.sends[i];
            let comm = self.send[peer]
                .as_mut()
                .expect("sends are only posted on open connections");
            if comm.test(req).map_err(|e| self.net_err(peer, e))? {
                self.sends.remove(i);
                if let Some(t) = self.trace.as_deref_mut() {
                    t.send_done(peer, req);
                }
            } else {
                i += 1;
            }
        }
        Ok(self.sends.len() != before)
    }

    /// Posts a send, or parks it in `blocked` if the transport is full.
    fn isend(&mut self, to: usize, src: Region) -> Result<()> {
        debug_assert!(self.blocked.is_none());
        if !self.try_isend(to, src)? {
            self.blocked = Some((to, src));
        }
        Ok(())
    }

    /// Retries the parked send; `true` once nothing is parked.
    fn retry_blocked(&mut self) -> Result<bool> {
        match self.blocked.take() {
            None => Ok(true),
            Some((to, src)) if self.try_isend(to, src)? => Ok(true),
            Some(parked) => {
                self.blocked = Some(parked);
                Ok(false)
            }
        }
    }

    fn try_isend(&mut self, to: usize, src: Region) -> Result<bool> {
        let tag = self.call.tag;
        let Some(comm) = self.send.get_mut(to).and_then(Option::as_mut) else {
            return Err(self.internal(format!("no connection to rank {to}")));
        };
        if self.eager {
            // SAFETY: `src` is a checked range of a buffer valid for the
            // whole run.
            let sent = unsafe { comm.send_eager(src.ptr, src.len, tag) };
            let sent = sent.map_err(|e| self.net_err(to, e))?;
            if sent {
                self.tel.sent(self.control, to, src.len);
            }
            if let Some(t) = self.trace.as_deref_mut() {
                t.send(to, src.len, if sent { Sent::Done } else { Sent::Full });
            }
            return Ok(sent);
        }
        let net = self.trace.as_deref_mut().and_then(|t| t.net_send(to));
        if net.is_some() {
            comm.profile(net);
        }
        // SAFETY: `src` is a checked range of a buffer that stays valid for
        // the whole run; `Run` only finishes once every send completed.
        let req = unsafe { comm.isend(src.ptr, src.len, tag, None) };
        if net.is_some() && !matches!(req, Ok(Some(_))) {
            comm.profile(None);
        }
        let req = req.map_err(|e| self.net_err(to, e))?;
        if let Some(t) = self.trace.as_deref_mut() {
            t.send(to, src.len, req.map_or(Sent::Full, Sent::Posted));
        }
        match req {
            Some(r) => {
                self.sends.push_back((to, r));
                self.tel.sent(self.control, to, src.len);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn execute(&mut self) -> Result<bool> {
        let mut moved = false;
        while self.cur < self.next_post {
            if !self.retry_blocked()? {
                break;
            }
            let step = self.call.sched.steps[self.cur];
            let mut slot = None;
            let mut lent = None;
            if let (Some(from), true) = (step.recv_peer(), self.eager) {
                if !self.recv_eager(step, from)? {
                    break;
                }
                slot = step.needs_slot().then_some(0);
            } else if let Some(from) = step.recv_peer() {
                let p = self.posted[self.cur]
                    .as_ref()
                    .ok_or_else(|| self.internal("receive not posted".into()))?;
                let (req, s) = (p.req, p.slot);
                let comm = self.recv[from]
                    .as_mut()
                    .expect("posted on an open connection");
                let got = if s.is_some() {
                    comm.test_lend(req)
                } else {
                    comm.test(req).map(|r| r.map(Received::Copied))
                };
                let got = match got.map_err(|e| self.net_err(from, e))? {
                    None => break,
                    Some(got) => got,
                };
                if got.len() != self.bytes(step.count()) {
                    let msg = format!(
                        "expected {} bytes, got {}",
                        self.bytes(step.count()),
                        got.len()
                    );
                    return Err(self.net_err(from, NetError::Protocol(msg)));
                }
                self.tel.received(self.control, from, got.len());
                if let Received::Lent { first, second } = got {
                    lent = Some((from, req, [first, second]));
                }
                self.posted[self.cur] = None;
                slot = s;
            }
            if let (Some(t), Some(from)) = (self.trace.as_deref_mut(), step.recv_peer()) {
                t.recv_arrived(from);
            }
            let result = self.exec_step(step, slot, lent.map(|l| l.2));
            if let Some((from, req, _)) = lent {
                let comm = self.recv[from]
                    .as_mut()
                    .expect("posted on an open connection");
                comm.release(req).map_err(|e| self.net_err(from, e))?;
            }
            result?;
            if let (Some(t), Some(from)) = (self.trace.as_deref_mut(), step.recv_peer()) {
                t.recv_done(from);
            }
            if let (Some(s), false) = (slot, self.eager) {
                self.free_slots.push(s);
            }
            self.cur += 1;
            moved = true;
        }
        if self.cur == self.call.sched.steps.len() && self.blocked.is_some() {
            moved |= self.retry_blocked()?;
        }
        Ok(moved)
    }

    /// Receives the data of `step`, from rank `from`, on the eager path:
    /// into its destination, or into staging slot 0 if it is to be reduced.
    /// `false`: it has not arrived yet.
    fn recv_eager(&mut self, step: Step, from: usize) -> Result<bool> {
        let bytes = self.bytes(step.count());
        let dst = match step {
            Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => {
                self.region(dst, step.count())?
            }
            // `Engine::eager` checked that a slot holds it.
            _ => Region::new(self.slots[0].ptr, bytes),
        };
        if let Some(t) = self.trace.as_deref_mut() {
            t.recv_waiting(from, bytes);
        }
        let tag = self.call.tag;
        let Some(comm) = self.recv.get_mut(from).and_then(Option::as_mut) else {
            return Err(self.internal(format!("no connection from rank {from}")));
        };
        // SAFETY: `dst` is a checked range of a user buffer, or a staging
        // slot, valid for the whole run; nothing else touches it meanwhile
        // (no receive is posted on the eager path).
        let got = unsafe { comm.recv_eager(dst.ptr, dst.len, tag) };
        match got.map_err(|e| self.net_err(from, e))? {
            None => Ok(false),
            Some(n) if n == bytes => {
                self.tel.received(self.control, from, n);
                Ok(true)
            }
            Some(n) => {
                let msg = format!("expected {bytes} bytes, got {n}");
                Err(self.net_err(from, NetError::Protocol(msg)))
            }
        }
    }

    /// Executes `step`; its incoming data is in staging `slot`, or in the
    /// transport's `lent` pieces.
    fn exec_step(
        &mut self,
        step: Step,
        slot: Option<usize>,
        lent: Option<[(*const u8, usize); 2]>,
    ) -> Result<()> {
        match step {
            Step::Send { to, src, count } => {
                let src = self.region(src, count)?;
                self.isend(to, src)
            }
            Step::Recv { .. } => Ok(()),
            Step::RecvCopySend { to, dst, count, .. } => {
                let dst = self.region(dst, count)?;
                self.isend(to, dst)
            }
            Step::Copy { src, dst, count } => {
                let (src, dst) = (self.region(src, count)?, self.region(dst, count)?);
                let stream = self.call.hints.stream_copies;
                // SAFETY: both ranges are bounds-checked parts of buffers
                // valid for this call that nothing else touches meanwhile.
                unsafe { super::copy_region(src, dst, stream) };
                Ok(())
            }
            Step::Reduce {
                src,
                dst,
                count,
                finalize,
            } => {
                let (src, dst) = (self.region(src, count)?, self.region(dst, count)?);
                self.reduce(dst, dst, src, finalize)
            }
            Step::RecvReduceCopySend {
                to,
                src,
                dst,
                count,
                finalize,
                ..
            } => {
                let slot = slot.ok_or_else(|| self.internal("reduction without a slot".into()))?;
                let (src, dst) = (self.region(src, count)?, self.region(dst, count)?);
                match lent {
                    None => {
                        let incoming = Region::new(self.slots[slot].ptr, self.bytes(count));
                        self.reduce(src, dst, incoming, finalize)?;
                    }
                    Some(pieces) => self.reduce_pieces(src, dst, pieces, finalize)?,
                }
                match to {
                    Some(to) => self.isend(to, dst),
                    None => Ok(()),
                }
            }
        }
    }

    /// `dst = src ⊕ incoming` where `incoming` is the concatenation of
    /// `pieces` lent by the transport (read-only, valid until released).
    // `is_multiple_of` is newer than the workspace's rust-version (1.85).
    #[allow(clippy::manual_is_multiple_of)]
    fn reduce_pieces(
        &self,
        src: Region,
        dst: Region,
        pieces: [(*const u8, usize); 2],
        finalize: bool,
    ) -> Result<()> {
        let es = self.call.dtype.size();
        if pieces[0].1 % es != 0 || pieces[0].1 + pieces[1].1 != dst.len {
            return Err(self.internal(format!(
                "lent pieces of {} + {} bytes do not split {} bytes of {es}-byte elements",
                pieces[0].1, pieces[1].1, dst.len
            )));
        }
        let mut off = 0;
        for (ptr, len) in pieces {
            if len == 0 {
                continue;
            }
            // `wrapping_add` keeps this free of unsafe; `off + len <=
            // dst.len == src.len` was checked above.
            let part = |r: Region| Region::new(r.ptr.wrapping_add(off), len);
            self.reduce(part(src), part(dst), Region::read_only(ptr, len), finalize)?;
            off += len;
        }
        Ok(())
    }

    /// `dst = src ⊕ incoming`, then the average's division if `finalize`.
    fn reduce(&self, src: Region, dst: Region, incoming: Region, finalize: bool) -> Result<()> {
        let (dt, op) = (self.call.dtype, self.call.op);
        if (src.ptr != dst.ptr && src.overlaps(dst)) || incoming.overlaps(dst) {
            return Err(self.internal("overlapping reduction operands".into()));
        }
        // SAFETY: `incoming` is a staging slot or scratch range (engine-owned),
        // or bytes lent by the transport until released (read-only), disjoint
        // from `dst` as checked above, holding completed data; `dst` is a checked
        // range of a writable buffer that no pending receive targets (the
        // schedule reduces each range once, after its data arrived).
        let (inc, out) = unsafe {
            (
                std::slice::from_raw_parts(incoming.ptr, incoming.len),
                std::slice::from_raw_parts_mut(dst.ptr, dst.len),
            )
        };
        if src.ptr == dst.ptr {
            reduce::reduce_inplace(dt, op, out, inc);
        } else {
            // SAFETY: `src` is a checked, readable range that does not
            // overlap `dst` (tested above).
            let a = unsafe { std::slice::from_raw_parts(src.ptr, src.len) };
            reduce::reduce_copy(dt, op, out, a, inc);
        }
        if finalize && op == RedOp::Avg {
            reduce::divide(dt, out, self.nranks);
        }
        Ok(())
    }
}
