//! NetPlugin profiler events: how a transport tells the profiler plugin
//! (NCCL's `ncclProfileNetPlugin` events, children of a ProxyStep) about
//! the socket writes or work requests that carry a message.
//!
//! NCCL's net plugins get a profiler handle with each `isend`/`irecv` and
//! report their own events through NCCL's callback, tagged with a plugin id
//! (type and version, `profiler_net.h`) and a descriptor of the plugin's
//! layout (`net_socket_v1.h`, `net_ib_v1.h`). Here the engine hands the
//! transport a [`NetProfile`] before posting a request
//! ([`crate::SendComm::profile`], [`crate::RecvComm::profile`]); the
//! transport starts and stops its events through it.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::ptr::null_mut;

/// Bits of a plugin id that hold the event layout's version
/// (`NCCL_PROFILER_NET_VER_BITS`); the type is above them.
pub const NET_VER_BITS: u32 = 16;
/// `NCCL_PROFILER_NET_TYPE_IB`.
pub const NET_TYPE_IB: i64 = 1 << NET_VER_BITS;
/// `NCCL_PROFILER_NET_TYPE_SOCK`.
pub const NET_TYPE_SOCK: i64 = 2 << NET_VER_BITS;
/// `NCCL_PROFILER_NET_IB_VER`: the version of [`IbDescrV1`].
pub const NET_IB_VER: i64 = 1;
/// `NCCL_PROFILER_NET_SOCKET_VER`: the version of [`SockDescrV1`].
pub const NET_SOCKET_VER: i64 = 1;
/// The id of events in [`SockDescrV1`] layout.
pub const SOCK_V1_ID: i64 = NET_TYPE_SOCK | NET_SOCKET_VER;
/// The id of events in [`IbDescrV1`] layout.
pub const IB_V1_ID: i64 = NET_TYPE_IB | NET_IB_VER;

/// `ncclProfileSocket`: the event type of a [`SockDescrV1`].
pub const PROFILE_SOCKET: u8 = 1;
/// `ncclProfileQp`: the event type of an [`IbDescrV1`].
pub const PROFILE_QP: u8 = 1;
/// `NCCL_SOCKET_SEND` / `NCCL_SOCKET_RECV`: [`Sock::op`].
pub const SOCKET_SEND: c_int = 0;
/// See [`SOCKET_SEND`].
pub const SOCKET_RECV: c_int = 1;

/// `ncclProfilerNetSockDescr_v1_t`: bytes of one message carried on one
/// socket.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SockDescrV1 {
    /// [`PROFILE_SOCKET`].
    pub ty: u8,
    /// The `sock` member of the C union.
    pub sock: Sock,
}

/// `sock` of [`SockDescrV1`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Sock {
    /// The socket's file descriptor.
    pub fd: c_int,
    /// [`SOCKET_SEND`] or [`SOCKET_RECV`].
    pub op: c_int,
    /// Payload bytes (no framing, no padding).
    pub length: usize,
}

/// `ncclProfilerNetIbDescr_v1_t`: one posted work request.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbDescrV1 {
    /// [`PROFILE_QP`].
    pub ty: u8,
    /// The `qp` member of the C union.
    pub qp: Qp,
}

/// `qp` of [`IbDescrV1`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Qp {
    /// The network device's index.
    pub device: c_int,
    /// The work request's id.
    pub wr_id: u64,
    /// Its `ibv_wr_opcode`.
    pub opcode: c_int,
    /// The queue pair's number.
    pub qp_num: c_int,
    /// Bytes of data it carries.
    pub length: usize,
}

/// Starts an event: `(ctx, parent, plugin id, descriptor)` to its handle
/// (NULL: none kept).
pub type StartFn = unsafe fn(*const c_void, *mut c_void, i64, *mut c_void) -> *mut c_void;
/// Stops an event: `(ctx, handle)`.
pub type StopFn = unsafe fn(*const c_void, *mut c_void);

/// Where the events of one request go: the profiler's entry points, its
/// context and the parent event (the request's ProxyStep).
#[derive(Clone, Copy)]
pub struct NetProfile {
    start: StartFn,
    stop: StopFn,
    ctx: *const c_void,
    parent: *mut c_void,
}

impl fmt::Debug for NetProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NetProfile({:p}, parent {:p})", self.ctx, self.parent)
    }
}

// SAFETY: the pointers are the profiler's context and event handle, which
// the interface lets any thread use; `NetProfile::new`'s contract keeps
// them valid while a transport holds the profile.
unsafe impl Send for NetProfile {}

impl NetProfile {
    /// A profile calling `start` and `stop` with `ctx`, events under `parent`.
    ///
    /// # Safety
    /// `start` and `stop` must be sound to call with `ctx` (and `parent`)
    /// until the request the profile is handed with completes or its comm
    /// is dropped.
    pub unsafe fn new(
        start: StartFn,
        stop: StopFn,
        ctx: *const c_void,
        parent: *mut c_void,
    ) -> Self {
        NetProfile {
            start,
            stop,
            ctx,
            parent,
        }
    }

    /// Starts the event of `length` payload bytes moved (`op`) on socket `fd`.
    pub fn socket(&self, fd: c_int, op: c_int, length: usize) -> NetEvent {
        let mut d = SockDescrV1 {
            ty: PROFILE_SOCKET,
            sock: Sock { fd, op, length },
        };
        self.start(SOCK_V1_ID, (&mut d as *mut SockDescrV1).cast())
    }

    /// Starts the event of a posted work request.
    pub fn qp(&self, qp: Qp) -> NetEvent {
        let mut d = IbDescrV1 { ty: PROFILE_QP, qp };
        self.start(IB_V1_ID, (&mut d as *mut IbDescrV1).cast())
    }

    fn start(&self, id: i64, data: *mut c_void) -> NetEvent {
        // SAFETY: `new`'s contract; `data` lives across the call (the
        // profiler reads it only during its start callback, as in NCCL).
        let h = unsafe { (self.start)(self.ctx, self.parent, id, data) };
        NetEvent(h)
    }

    /// Stops `e` (nothing for an event the profiler keeps no handle of).
    pub fn stop(&self, e: NetEvent) {
        if !e.0.is_null() {
            // SAFETY: `new`'s contract; `e` was started through this profile
            // and is stopped once (`NetEvent` is not `Clone`).
            unsafe { (self.stop)(self.ctx, e.0) }
        }
    }
}

/// A started NetPlugin event, to be stopped once with [`NetProfile::stop`].
#[derive(Debug)]
pub struct NetEvent(*mut c_void);

impl NetEvent {
    /// No event.
    pub const NONE: NetEvent = NetEvent(null_mut());
}

// SAFETY: the profiler's event handle, usable from any thread.
unsafe impl Send for NetEvent {}

/// The NetPlugin events of one request: started as its parts go out (or
/// come in), all stopped when it completes.
pub struct RequestEvents {
    p: NetProfile,
    events: Vec<NetEvent>,
}

impl RequestEvents {
    /// No events yet, to be reported through `p`.
    pub fn new(p: NetProfile) -> Box<RequestEvents> {
        Box::new(RequestEvents {
            p,
            events: Vec::new(),
        })
    }

    /// Starts the event of `length` payload bytes moved (`op`) on socket `fd`.
    pub fn socket(&mut self, fd: c_int, op: c_int, length: usize) {
        self.events.push(self.p.socket(fd, op, length));
    }

    /// Starts the event of a posted work request.
    pub fn qp(&mut self, qp: Qp) {
        self.events.push(self.p.qp(qp));
    }

    /// Stops every event (the request completed).
    pub fn finish(self: Box<Self>) {
        for e in self.events {
            self.p.stop(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_and_ids_are_nccls() {
        // LP64: what a C compiler gives the v1 descriptors.
        assert_eq!(offset_of!(SockDescrV1, sock), 8);
        assert_eq!(
            [
                offset_of!(Sock, fd),
                offset_of!(Sock, op),
                offset_of!(Sock, length)
            ],
            [0, 4, 8]
        );
        assert_eq!(size_of::<SockDescrV1>(), 24);
        assert_eq!(offset_of!(IbDescrV1, qp), 8);
        assert_eq!(
            [
                offset_of!(Qp, device),
                offset_of!(Qp, wr_id),
                offset_of!(Qp, opcode),
                offset_of!(Qp, qp_num),
                offset_of!(Qp, length)
            ],
            [0, 8, 16, 20, 24]
        );
        assert_eq!(size_of::<IbDescrV1>(), 40);
        assert_eq!((SOCK_V1_ID, IB_V1_ID), (0x2_0001, 0x1_0001));
    }

    thread_local! {
        static SEEN: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    unsafe fn start(
        ctx: *const c_void,
        parent: *mut c_void,
        id: i64,
        d: *mut c_void,
    ) -> *mut c_void {
        // SAFETY: a socket descriptor, as the test starts only those.
        let s = unsafe { (*d.cast::<SockDescrV1>()).sock };
        SEEN.with(|v| {
            v.borrow_mut().push(format!(
                "start {} {} {id:#x} fd={} op={} len={}",
                ctx as usize, parent as usize, s.fd, s.op, s.length
            ))
        });
        7 as *mut c_void
    }

    unsafe fn stop(ctx: *const c_void, h: *mut c_void) {
        SEEN.with(|v| {
            v.borrow_mut()
                .push(format!("stop {} {}", ctx as usize, h as usize))
        });
    }

    #[test]
    fn a_profile_starts_and_stops_through_its_entry_points() {
        // SAFETY: the entry points dereference nothing but the descriptor.
        let p = unsafe { NetProfile::new(start, stop, 3 as *const c_void, 5 as *mut c_void) };
        let e = p.socket(9, SOCKET_RECV, 100);
        p.stop(e);
        p.stop(NetEvent::NONE);
        let mut r = RequestEvents::new(p);
        r.socket(4, SOCKET_SEND, 1);
        r.socket(5, SOCKET_SEND, 2);
        r.finish();
        let seen = SEEN.with(|v| v.take());
        assert_eq!(
            seen,
            [
                "start 3 5 0x20001 fd=9 op=1 len=100",
                "stop 3 7",
                "start 3 5 0x20001 fd=4 op=0 len=1",
                "start 3 5 0x20001 fd=5 op=0 len=2",
                "stop 3 7",
                "stop 3 7"
            ]
        );
    }
}
