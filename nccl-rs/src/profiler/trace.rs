//! One call's events below its Coll or P2p events: a KernelCh per task,
//! and, for the peers reached over a network transport, a ProxyOp per peer
//! and direction and a ProxyStep per message, with their state transitions,
//! and the transport's NetPlugin events under the steps. The engine calls
//! the hooks of [`Trace`] as it posts, waits on and completes messages (see
//! `docs/profiler.md` for the mapping).

use super::ffi::{self, bits, state, Descr, StateArgs};
use crate::schedule::Schedule;
use crate::transport::Request;
use nccl_net::NetProfile;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

/// The plugin's entry points and one communicator's context.
#[derive(Clone, Copy)]
pub(crate) struct Api {
    pub(crate) ctx: *mut c_void,
    pub(crate) start: ffi::StartFn,
    pub(crate) stop: ffi::StopFn,
    pub(crate) record: ffi::RecordFn,
    pub(crate) rank: c_int,
}

impl Api {
    /// A descriptor of type `ty` under `parent`, every other field zero.
    pub(crate) fn descr(&self, ty: u64, parent: *mut c_void) -> Descr {
        // SAFETY: `Descr` is plain C data (integers and pointers), for
        // which all-zero bytes are a valid value, as the C side's `= {0}`.
        let mut d: Descr = unsafe { std::mem::zeroed() };
        d.ty = ty;
        d.parent = parent;
        d.rank = self.rank;
        d
    }

    /// Starts the event `d`: its handle (NULL where the plugin keeps none).
    pub(crate) fn start(&self, mut d: Descr) -> *mut c_void {
        let mut h = null_mut();
        // SAFETY: the plugin's startEvent with its context, a valid
        // out-pointer and a descriptor that lives across the call; the
        // strings it points to are static.
        unsafe { (self.start)(self.ctx, &mut h, &mut d) };
        h
    }

    /// Stops `h` (nothing for NULL, as NCCL).
    pub(crate) fn stop(&self, h: *mut c_void) {
        if !h.is_null() {
            // SAFETY: `h` came from this plugin's startEvent and is stopped once.
            unsafe { (self.stop)(h) };
        }
    }

    /// Records state `s` of `h`, with `size` as `transSize` where given.
    fn record(&self, h: *mut c_void, s: c_int, size: Option<usize>) {
        if h.is_null() {
            return;
        }
        let mut args = StateArgs {
            trans_size: size.unwrap_or(0),
        };
        let p = match size {
            Some(_) => &mut args as *mut StateArgs,
            None => null_mut(),
        };
        // SAFETY: `h` is a live handle of this plugin; `p` is NULL or
        // points to arguments that live across the call.
        unsafe { (self.record)(h, s, p) };
    }

    /// Records `KernelChStop` of `h` with its timestamp, and stops it.
    fn stop_kernel(&self, h: *mut c_void) {
        if h.is_null() {
            return;
        }
        let mut args = StateArgs { p_timer: now_ns() };
        // SAFETY: `h` is a live KernelCh handle of this plugin; `args`
        // lives across the call.
        unsafe { (self.record)(h, state::KERNEL_CH_STOP, &mut args) };
        self.stop(h);
    }
}

/// The monotonic clock in nanoseconds: the KernelCh events' `pTimer` (the
/// work is timed by the thread that does it, as NCCL's by its kernel).
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// [`nccl_net::profile::StartFn`]: starts a NetPlugin event under `parent`
/// through the [`Api`] at `ctx`.
unsafe fn net_start(
    ctx: *const c_void,
    parent: *mut c_void,
    id: i64,
    data: *mut c_void,
) -> *mut c_void {
    // SAFETY: `ctx` is the `Api` of a live trace (`Trace::profile`).
    let api = unsafe { &*ctx.cast::<Api>() };
    let mut d = api.descr(bits::NET_PLUGIN, parent);
    d.u.net_plugin = ffi::NetPluginDescr { id, data };
    api.start(d)
}

/// [`nccl_net::profile::StopFn`].
unsafe fn net_stop(ctx: *const c_void, h: *mut c_void) {
    // SAFETY: as in `net_start`.
    let api = unsafe { &*ctx.cast::<Api>() };
    api.stop(h);
}

/// What became of a send the engine tried.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Sent {
    /// The transport had no room yet: the send waits for the peer.
    Full,
    /// Posted; completes when this request tests done.
    Posted(Request),
    /// Written and complete at once (the eager path).
    Done,
}

const NONE: u32 = u32::MAX;

/// One ProxyOp: a peer and direction of the call.
struct Op {
    handle: *mut c_void,
    /// The number the next ProxyStep gets.
    next: c_int,
    progressing: bool,
    /// The send step being tried (a send parked on a full transport), and
    /// whether it recorded its wait already.
    cur: *mut c_void,
    waited: bool,
    /// Receive steps posted and not yet done, oldest first.
    queue: VecDeque<*mut c_void>,
    /// The receive step started before its post (for the transport's
    /// NetPlugin events), if the post has not gone through yet.
    ahead: *mut c_void,
}

/// One call's ProxyOp and ProxyStep events (kept and reused by the
/// communicator's profiler).
pub(crate) struct Trace {
    pub(crate) api: Api,
    steps: bool,
    /// The transports report NetPlugin events.
    net_events: bool,
    /// The Group event and the Coll or P2p events under it.
    pub(crate) group: *mut c_void,
    pub(crate) parents: Vec<*mut c_void>,
    /// The KernelCh events under them.
    pub(crate) kernel: Vec<*mut c_void>,
    /// The call's ProxyOps: the first `live` of `ops` (the rest keep their
    /// memory for later calls).
    ops: Vec<Op>,
    live: usize,
    /// Per peer and direction: steps and the largest message.
    tally: Vec<[(i64, usize); 2]>,
    pid: libc::pid_t,
    /// Per peer, the index in `ops` of its send and receive ProxyOps.
    index: Vec<[u32; 2]>,
    /// Posted sends: peer, request, step.
    pending: Vec<(usize, Request, *mut c_void)>,
}

// SAFETY: the handles are the plugin's opaque pointers; the interface lets
// them be used from any thread, and a trace is used by one at a time.
unsafe impl Send for Trace {}

impl Trace {
    pub(crate) fn new(api: Api) -> Trace {
        Trace {
            api,
            steps: false,
            net_events: false,
            group: null_mut(),
            parents: Vec::new(),
            kernel: Vec::new(),
            ops: Vec::new(),
            live: 0,
            tally: Vec::new(),
            // SAFETY: `getpid` has no preconditions.
            pid: unsafe { libc::getpid() },
            index: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Starts a KernelCh event (channel 0: the schedules are
    /// single-channel) under `parent` where `mask` asks for it.
    pub(crate) fn start_kernel(&mut self, mask: u64, parent: *mut c_void) {
        if mask & bits::KERNEL_CH == 0 {
            return;
        }
        let mut d = self.api.descr(bits::KERNEL_CH, parent);
        d.u.kernel_ch = ffi::KernelChDescr {
            channel_id: 0,
            p_timer: now_ns(),
        };
        let h = self.api.start(d);
        self.kernel.push(h);
    }

    /// Starts the ProxyOps of `sched` (elements of `elem` bytes) where
    /// `mask` asks for them, one per peer reached over a network transport
    /// (`net[peer]`, empty where none is; as in NCCL, where only those
    /// have a proxy) and direction, each under the parent
    /// `parent_of(peer, is_send)` gives.
    pub(crate) fn start_ops(
        &mut self,
        mask: u64,
        sched: &Schedule,
        elem: usize,
        net: &[bool],
        parent_of: impl Fn(usize, bool) -> *mut c_void,
    ) {
        let nranks = net.len();
        self.steps = mask & (bits::PROXY_STEP | bits::NET_PLUGIN) != 0;
        self.net_events = mask & bits::NET_PLUGIN != 0;
        self.live = 0;
        self.pending.clear();
        self.index.clear();
        if nranks == 0 || mask & (bits::PROXY_OP | bits::PROXY_STEP | bits::NET_PLUGIN) == 0 {
            return;
        }
        self.index.resize(nranks, [NONE; 2]);
        let mut tally = std::mem::take(&mut self.tally);
        tally.clear();
        tally.resize(nranks, [(0, 0); 2]);
        for s in &sched.steps {
            let bytes = s.count() * elem;
            let dirs = [(s.send_peer(), 0), (s.recv_peer(), 1)];
            for (peer, d) in dirs {
                let peer = peer.filter(|&p| net.get(p) == Some(&true));
                if let Some(t) = peer.and_then(|p| tally.get_mut(p)) {
                    t[d].0 += 1;
                    t[d].1 = t[d].1.max(bytes);
                }
            }
        }
        let pid = self.pid;
        for (peer, t) in tally.iter().enumerate() {
            for (d, &(n, max)) in t.iter().enumerate() {
                if n == 0 {
                    continue;
                }
                let is_send = d == 0;
                let mut descr = self.api.descr(bits::PROXY_OP, parent_of(peer, is_send));
                descr.u.proxy_op = ffi::ProxyOpDescr {
                    pid,
                    // The schedules are single-channel.
                    channel_id: 0,
                    peer: peer as c_int,
                    n_steps: c_int::try_from(n).unwrap_or(c_int::MAX),
                    chunk_size: c_int::try_from(max).unwrap_or(c_int::MAX),
                    is_send: c_int::from(is_send),
                };
                self.index[peer][d] = self.live as u32;
                let handle = self.api.start(descr);
                match self.ops.get_mut(self.live) {
                    Some(op) => {
                        op.handle = handle;
                        op.next = 0;
                        op.progressing = false;
                        op.cur = null_mut();
                        op.waited = false;
                        op.queue.clear();
                        op.ahead = null_mut();
                    }
                    None => self.ops.push(Op {
                        handle,
                        next: 0,
                        progressing: false,
                        cur: null_mut(),
                        waited: false,
                        queue: VecDeque::new(),
                        ahead: null_mut(),
                    }),
                }
                self.live += 1;
            }
        }
        self.tally = tally;
    }

    fn op(&mut self, peer: usize, d: usize) -> Option<&mut Op> {
        let i = *self.index.get(peer)?.get(d)? as usize;
        self.ops[..self.live].get_mut(i)
    }

    /// Starts the op's next ProxyStep (the op progresses from its first).
    fn step(api: &Api, steps: bool, op: &mut Op) -> *mut c_void {
        if !op.progressing {
            op.progressing = true;
            api.record(op.handle, state::OP_IN_PROGRESS, None);
        }
        if !steps {
            return null_mut();
        }
        let mut d = api.descr(bits::PROXY_STEP, op.handle);
        d.u.proxy_step = ffi::ProxyStepDescr { step: op.next };
        op.next += 1;
        api.start(d)
    }

    /// A profile for the transport's NetPlugin events, under `step`.
    fn profile(&self, step: *mut c_void) -> Option<NetProfile> {
        if step.is_null() {
            return None;
        }
        // SAFETY: `net_start` and `net_stop` read `self.api`, which lives
        // as long as this boxed trace: the communicator keeps it for its
        // next call, and a request's events end before its call does.
        Some(unsafe {
            NetProfile::new(net_start, net_stop, (&self.api as *const Api).cast(), step)
        })
    }

    /// The NetPlugin profile of the send the engine is about to try to
    /// `peer` (its ProxyStep starts now), where the mask asks for them.
    // Out of line: the engine's polling path calls these only with a plugin.
    #[inline(never)]
    pub(crate) fn net_send(&mut self, peer: usize) -> Option<NetProfile> {
        if !self.net_events {
            return None;
        }
        let (api, steps) = (self.api, self.steps);
        let op = self.op(peer, 0)?;
        if op.cur.is_null() && !op.waited {
            op.cur = Self::step(&api, steps, op);
        }
        let h = op.cur;
        self.profile(h)
    }

    /// The NetPlugin profile of the receive the engine is about to post
    /// from `peer` (its ProxyStep starts now), where the mask asks for them.
    // Out of line: the engine's polling path calls these only with a plugin.
    #[inline(never)]
    pub(crate) fn net_recv(&mut self, peer: usize) -> Option<NetProfile> {
        if !self.net_events {
            return None;
        }
        let (api, steps) = (self.api, self.steps);
        let op = self.op(peer, 1)?;
        if op.ahead.is_null() {
            op.ahead = Self::step(&api, steps, op);
        }
        let h = op.ahead;
        self.profile(h)
    }

    /// The engine tried to send `bytes` to `peer`.
    // Out of line: the engine's polling path calls these only with a plugin.
    #[inline(never)]
    pub(crate) fn send(&mut self, peer: usize, bytes: usize, sent: Sent) {
        let (api, steps) = (self.api, self.steps);
        let Some(op) = self.op(peer, 0) else { return };
        if op.cur.is_null() && !op.waited {
            op.cur = Self::step(&api, steps, op);
        }
        let h = op.cur;
        match sent {
            Sent::Full => {
                if !op.waited {
                    op.waited = true;
                    api.record(h, state::STEP_SEND_PEER_WAIT, None);
                }
            }
            Sent::Posted(req) => {
                op.cur = null_mut();
                op.waited = false;
                api.record(h, state::STEP_SEND_WAIT, Some(bytes));
                if !h.is_null() {
                    self.pending.push((peer, req, h));
                }
            }
            Sent::Done => {
                op.cur = null_mut();
                op.waited = false;
                api.record(h, state::STEP_SEND_WAIT, Some(bytes));
                api.stop(h);
            }
        }
    }

    /// The send `req` to `peer` completed.
    // Out of line: the engine's polling path calls these only with a plugin.
    #[inline(never)]
    pub(crate) fn send_done(&mut self, peer: usize, req: Request) {
        if let Some(i) = self.pending.iter().position(|p| p.0 == peer && p.1 == req) {
            let (.., h) = self.pending.swap_remove(i);
            self.api.stop(h);
        }
    }

    /// A receive of `bytes` from `peer` was posted.
    // Out of line: the engine's polling path calls these only with a plugin.
    #[inline(never)]
    pub(crate) fn recv_posted(&mut self, peer: usize, bytes: usize) {
        let (api, steps) = (self.api, self.steps);
        let Some(op) = self.op(peer, 1) else { return };
        let h = match std::mem::replace(&mut op.ahead, null_mut()) {
            h if !h.is_null() => h,
            _ => Self::step(&api, steps, op),
        };
        api.record(h, state::STEP_RECV_WAIT, Some(bytes));
        op.queue.push_back(h);
    }

    /// The eager path waits for `bytes` from `peer` (called at every poll:
    /// the step starts at the first).
    // Out of line: the engine's polling path calls these only with a plugin.
    #[inline(never)]
    pub(crate) fn recv_waiting(&mut self, peer: usize, bytes: usize) {
        if self.op(peer, 1).is_some_and(|op| op.queue.is_empty()) {
            self.recv_posted(peer, bytes);
        }
    }

    /// The oldest receive from `peer` has its data, now being consumed.
    // Out of line: the engine's polling path calls these only with a plugin.
    #[inline(never)]
    pub(crate) fn recv_arrived(&mut self, peer: usize) {
        let api = self.api;
        if let Some(&h) = self.op(peer, 1).and_then(|op| op.queue.front()) {
            api.record(h, state::STEP_RECV_GPU_WAIT, None);
        }
    }

    /// The oldest receive from `peer` was consumed.
    // Out of line: the engine's polling path calls these only with a plugin.
    #[inline(never)]
    pub(crate) fn recv_done(&mut self, peer: usize) {
        let api = self.api;
        if let Some(h) = self.op(peer, 1).and_then(|op| op.queue.pop_front()) {
            api.stop(h);
        }
    }

    /// Stops every event of the call still open, innermost first (steps
    /// left open by a failed call included).
    pub(crate) fn stop_all(&mut self) {
        let api = self.api;
        for (.., h) in self.pending.drain(..) {
            api.stop(h);
        }
        for op in &mut self.ops[..self.live] {
            api.stop(std::mem::replace(&mut op.cur, null_mut()));
            api.stop(std::mem::replace(&mut op.ahead, null_mut()));
            for h in op.queue.drain(..) {
                api.stop(h);
            }
            api.stop(op.handle);
        }
        self.live = 0;
        for h in self.kernel.drain(..) {
            api.stop_kernel(h);
        }
        for h in self.parents.drain(..) {
            api.stop(h);
        }
        api.stop(std::mem::replace(&mut self.group, null_mut()));
    }
}

#[cfg(test)]
mod tests {
    //! The trace against a plugin written here: every callback appends a
    //! line naming the event (by the order it started) to a per-thread log.

    use super::*;
    use crate::schedule::{Loc, Step};
    use std::cell::RefCell;

    thread_local! {
        static LOG: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    fn push(s: String) {
        LOG.with(|l| l.borrow_mut().push(s));
    }

    fn take() -> Vec<String> {
        LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
    }

    /// Handles are event numbers from 1 (the pointer's address).
    fn id(h: *mut c_void) -> usize {
        h as usize
    }

    unsafe extern "C" fn start(_: *mut c_void, h: *mut *mut c_void, d: *mut Descr) -> c_int {
        // SAFETY: the trace passes valid pointers.
        let (h, d) = unsafe { (&mut *h, &*d) };
        let n = LOG.with(|l| l.borrow().iter().filter(|s| s.starts_with("start")).count()) + 1;
        *h = n as *mut c_void;
        let what = match d.ty {
            // SAFETY: the union member of the event's type.
            bits::PROXY_OP => unsafe {
                let o = d.u.proxy_op;
                format!(
                    "op peer={} send={} steps={} chunk={}",
                    o.peer, o.is_send, o.n_steps, o.chunk_size
                )
            },
            // SAFETY: as above.
            bits::PROXY_STEP => unsafe { format!("step {}", d.u.proxy_step.step) },
            // SAFETY: as above; the socket descriptor lives across the call.
            bits::NET_PLUGIN => unsafe {
                let n = d.u.net_plugin;
                let sock = (*n.data.cast::<nccl_net::profile::SockDescrV1>()).sock;
                format!("net {:#x} fd={} len={}", n.id, sock.fd, sock.length)
            },
            // SAFETY: as above.
            bits::KERNEL_CH => unsafe {
                let k = d.u.kernel_ch;
                format!("kernel ch={} timed={}", k.channel_id, k.p_timer > 0)
            },
            t => format!("type {t}"),
        };
        push(format!("start {n} parent={} {what}", id(d.parent)));
        0
    }

    unsafe extern "C" fn stop(h: *mut c_void) -> c_int {
        push(format!("stop {}", id(h)));
        0
    }

    unsafe extern "C" fn record(h: *mut c_void, s: c_int, a: *mut StateArgs) -> c_int {
        let size = match a.is_null() {
            true => String::new(),
            // SAFETY: non-null arguments live across the call.
            false => format!(" size={}", unsafe { (*a).trans_size }),
        };
        push(format!("state {} {s}{size}", id(h)));
        0
    }

    fn trace(mask: u64, steps: Vec<Step>) -> Trace {
        trace_over(mask, steps, &[true; 3])
    }

    fn trace_over(mask: u64, steps: Vec<Step>, net: &[bool]) -> Trace {
        let api = Api {
            ctx: null_mut(),
            start,
            stop,
            record,
            rank: 0,
        };
        let mut t = Trace::new(api);
        let sched = Schedule { steps, scratch: 0 };
        // The parent: event 99.
        t.start_ops(mask, &sched, 4, net, |_, _| 99 as *mut c_void);
        t
    }

    fn send(to: usize, count: usize) -> Step {
        Step::Send {
            to,
            src: Loc::In(0),
            count,
        }
    }

    fn recv(from: usize, count: usize) -> Step {
        Step::Recv {
            from,
            dst: Loc::Out(0),
            count,
        }
    }

    const ALL: u64 = bits::PROXY_OP | bits::PROXY_STEP;

    #[test]
    fn a_send_waits_on_a_full_transport_then_completes_by_request() {
        let mut t = trace(ALL, vec![send(2, 3), send(2, 5)]);
        t.send(2, 12, Sent::Full);
        t.send(2, 12, Sent::Full);
        t.send(2, 12, Sent::Posted(Request(7)));
        t.send(2, 20, Sent::Posted(Request(8)));
        t.send_done(2, Request(8));
        t.send_done(2, Request(7));
        t.send_done(2, Request(7));
        t.stop_all();
        assert_eq!(
            take(),
            [
                "start 1 parent=99 op peer=2 send=1 steps=2 chunk=20",
                "state 1 19",
                "start 2 parent=1 step 0",
                "state 2 20",
                "state 2 9 size=12",
                "start 3 parent=1 step 1",
                "state 3 9 size=20",
                "stop 3",
                "stop 2",
                "stop 1",
            ]
        );
    }

    #[test]
    fn receives_posted_ahead_complete_in_order_and_eager_ones_start_once() {
        let mut t = trace(ALL, vec![recv(1, 2), recv(1, 2), send(1, 2)]);
        t.recv_posted(1, 8);
        t.recv_posted(1, 8);
        t.recv_arrived(1);
        t.recv_done(1);
        t.recv_arrived(1);
        t.recv_done(1);
        t.send(1, 8, Sent::Done);
        assert_eq!(
            take(),
            [
                "start 1 parent=99 op peer=1 send=1 steps=1 chunk=8",
                "start 2 parent=99 op peer=1 send=0 steps=2 chunk=8",
                "state 2 19",
                "start 3 parent=2 step 0",
                "state 3 10 size=8",
                "start 4 parent=2 step 1",
                "state 4 10 size=8",
                "state 3 12",
                "stop 3",
                "state 4 12",
                "stop 4",
                "state 1 19",
                "start 5 parent=1 step 0",
                "state 5 9 size=8",
                "stop 5",
            ]
        );
        t.stop_all();
        assert_eq!(take(), ["stop 1", "stop 2"]);
        // The eager path asks at every poll; one step starts.
        let mut t = trace(ALL, vec![recv(0, 1)]);
        t.recv_waiting(0, 4);
        t.recv_waiting(0, 4);
        t.recv_arrived(0);
        t.recv_done(0);
        t.stop_all();
        assert_eq!(
            take(),
            [
                "start 1 parent=99 op peer=0 send=0 steps=1 chunk=4",
                "state 1 19",
                "start 2 parent=1 step 0",
                "state 2 10 size=4",
                "state 2 12",
                "stop 2",
                "stop 1",
            ]
        );
    }

    #[test]
    fn a_failed_call_stops_what_it_left_open() {
        let mut t = trace(ALL, vec![recv(1, 1), send(2, 1), send(2, 1)]);
        t.recv_posted(1, 4);
        t.send(2, 4, Sent::Posted(Request(1)));
        t.send(2, 4, Sent::Full);
        take();
        t.stop_all();
        let mut got = take();
        got.sort();
        // Steps 3 (receive), 4 and 5 (sends), then the ops 1 and 2.
        assert_eq!(got, ["stop 1", "stop 2", "stop 3", "stop 4", "stop 5"]);
    }

    #[test]
    fn the_mask_decides_ops_and_steps() {
        // ProxyOp only: ops progress, no steps.
        let mut t = trace(bits::PROXY_OP, vec![send(1, 1)]);
        t.send(1, 4, Sent::Posted(Request(3)));
        t.send_done(1, Request(3));
        t.stop_all();
        assert_eq!(
            take(),
            [
                "start 1 parent=99 op peer=1 send=1 steps=1 chunk=4",
                "state 1 19",
                "stop 1",
            ]
        );
        // Neither: nothing at all.
        let mut t = trace(bits::COLL, vec![send(1, 1), recv(2, 1)]);
        t.send(1, 4, Sent::Done);
        t.recv_posted(2, 4);
        t.recv_done(2);
        t.stop_all();
        assert_eq!(take(), Vec::<String>::new());
    }

    #[test]
    fn only_network_peers_have_proxy_ops_and_each_task_a_kernel_channel() {
        let all = ALL | bits::KERNEL_CH;
        // Rank 1 over shared memory, rank 2 over the network.
        let mut t = trace_over(all, vec![send(1, 1), send(2, 1)], &[false, false, true]);
        t.start_kernel(all, 98 as *mut c_void);
        t.send(1, 4, Sent::Done);
        t.send(2, 4, Sent::Done);
        t.stop_all();
        let log = take();
        assert_eq!(
            log[..6],
            [
                "start 1 parent=99 op peer=2 send=1 steps=1 chunk=4",
                "start 2 parent=98 kernel ch=0 timed=true",
                "state 1 19",
                "start 3 parent=1 step 0",
                "state 3 9 size=4",
                "stop 3",
            ]
        );
        // The KernelCh stops with its timestamp, after the ops.
        assert_eq!(log[6], "stop 1");
        assert!(log[7].starts_with("state 2 22 size="), "{log:?}");
        assert_eq!(log[8..], ["stop 2"]);
        // Without the bit: no KernelCh.
        let mut t = trace_over(ALL, vec![], &[false; 2]);
        t.start_kernel(ALL, 98 as *mut c_void);
        t.stop_all();
        assert_eq!(take(), Vec::<String>::new());
    }

    #[test]
    fn transports_report_net_plugin_events_under_the_step() {
        use nccl_net::profile::{RequestEvents, SOCKET_RECV, SOCKET_SEND};
        let mut t = trace(ALL | bits::NET_PLUGIN, vec![send(1, 3), recv(2, 2)]);
        // A send that finds the transport full keeps its step and profile.
        let p = t.net_send(1).expect("a profile");
        t.send(1, 12, Sent::Full);
        assert_eq!(
            t.net_send(1).map(|q| format!("{q:?}")),
            Some(format!("{p:?}"))
        );
        let mut ev = RequestEvents::new(p);
        ev.socket(7, SOCKET_SEND, 12);
        t.send(1, 12, Sent::Posted(Request(1)));
        ev.finish();
        t.send_done(1, Request(1));
        // A receive's step starts before its post, and is the one posted.
        let p = t.net_recv(2).expect("a profile");
        assert_eq!(
            t.net_recv(2).map(|q| format!("{q:?}")),
            Some(format!("{p:?}"))
        );
        t.recv_posted(2, 8);
        let mut ev = RequestEvents::new(p);
        ev.socket(8, SOCKET_RECV, 5);
        ev.socket(9, SOCKET_RECV, 3);
        t.recv_arrived(2);
        ev.finish();
        t.recv_done(2);
        t.stop_all();
        assert_eq!(
            take(),
            [
                "start 1 parent=99 op peer=1 send=1 steps=1 chunk=12",
                "start 2 parent=99 op peer=2 send=0 steps=1 chunk=8",
                "state 1 19",
                "start 3 parent=1 step 0",
                "state 3 20",
                "start 4 parent=3 net 0x20001 fd=7 len=12",
                "state 3 9 size=12",
                "stop 4",
                "stop 3",
                "state 2 19",
                "start 5 parent=2 step 0",
                "state 5 10 size=8",
                "start 6 parent=5 net 0x20001 fd=8 len=5",
                "start 7 parent=5 net 0x20001 fd=9 len=3",
                "state 5 12",
                "stop 6",
                "stop 7",
                "stop 5",
                "stop 1",
                "stop 2",
            ]
        );
        // Without the bit the engine gets no profile; for a peer without
        // ProxyOps neither.
        let mut t = trace(ALL, vec![send(1, 1)]);
        assert!(t.net_send(1).is_none() && t.net_recv(1).is_none());
        let mut t = trace_over(ALL | bits::NET_PLUGIN, vec![send(1, 1)], &[false; 2]);
        assert!(t.net_send(1).is_none());
        t.stop_all();
        take();
    }
}
