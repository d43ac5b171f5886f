//! The transport seam of nccl-rs.
//!
//! This crate holds only the trait every data transport implements, shaped
//! after NCCL's net plugin (`ncclNet_t`): `listen` / `connect` / `accept`,
//! memory registration, tagged `isend` / `irecv` that return requests, `test`
//! to poll them, and close (by dropping). It lives in its own crate so that
//! transports in other crates (`transport-tcp`, later `transport-verbs`) and
//! the core (`nccl-rs`) can both depend on it without a cycle, exactly as an
//! NCCL net plugin only needs NCCL's plugin header.
//!
//! # Call-order contract
//! 1. The receiving side calls [`Net::listen`] and hands
//!    [`Listener::handle`] (at most [`MAX_HANDLE_BYTES`] bytes) to the sending
//!    side out of band (the bootstrap does this).
//! 2. The sending side calls [`Net::connect`] with those bytes and polls the
//!    returned [`Connector`] until it yields a [`SendComm`]; the receiving
//!    side polls [`Listener::accept`] until it yields a [`RecvComm`]. Both
//!    sides must be polled concurrently: neither completes alone.
//! 3. Messages on one connection are matched in posting order. The n-th
//!    `isend` on a [`SendComm`] is delivered into the n-th `irecv` on the
//!    matching [`RecvComm`]; a tag mismatch is reported as
//!    [`NetError::TagMismatch`], and a message longer than the posted receive
//!    as [`NetError::Truncated`].
//! 4. Requests are polled with `test` on the comm that issued them until they
//!    report completion. Every pending request must be tested to completion
//!    (or the comm dropped) before its buffer is reused or freed.
//!
//! # Blocking
//! No method of these traits blocks waiting for a peer. `connect`, `accept`,
//! `isend`, `irecv` and `test` may perform non-blocking system calls and
//! return "not yet" (`Ok(None)` / `Ok(false)`); the caller polls again.
//! `listen` and `reg_mr` may make short local system calls (bind, pin pages).
#![forbid(unsafe_op_in_unsafe_fn)]

use std::fmt;

pub mod profile;
mod request_queue;
pub use profile::{NetEvent, NetProfile};
pub use request_queue::RequestQueue;
mod link;
mod sockaddr;
pub use link::{LinkCounters, LinkProbe, SharedProbe};
pub use sockaddr::{decode_sockaddr, encode_sockaddr, SOCKADDR_END};

/// `NCCL_CROSS_NIC`: whether a connection may join different rails (NCCL's
/// values 0, 1, 2). Rails are separate networks (rail k of every host on
/// its own switch), so this only matters when the two ends have different
/// rail counts. The network transports share it; the connecting side's
/// value applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CrossNic {
    /// 0: rail k only to rail k; a connection uses the rails both ends
    /// have (the smaller count), the richer side's extra rails stay idle.
    Off,
    /// 1: rails may cross; a connection uses the larger rail count and the
    /// poorer side's rails are reused round-robin (rail k to rail
    /// k mod R). Only for rails that route to each other.
    On,
    /// 2 (NCCL's default): as `Off`, always possible with one connection
    /// per rail pair (NCCL uses it to let its topology search cross rails
    /// when it must).
    #[default]
    Auto,
}

impl CrossNic {
    /// NCCL's value: 0, 1 or 2.
    pub fn from_value(v: i64) -> Option<CrossNic> {
        match v {
            0 => Some(CrossNic::Off),
            1 => Some(CrossNic::On),
            2 => Some(CrossNic::Auto),
            _ => None,
        }
    }

    /// The variable's text (surrounding blanks allowed).
    pub fn parse(text: &str) -> Option<CrossNic> {
        text.trim().parse().ok().and_then(CrossNic::from_value)
    }
}

/// The largest connection handle a transport may produce (as NCCL's
/// `NCCL_NET_HANDLE_MAXSIZE`).
pub const MAX_HANDLE_BYTES: usize = 128;

/// Which kinds of memory a transport can read and write directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PtrSupport {
    /// Host (CPU) memory.
    pub host: bool,
    /// CUDA device memory (GPUDirect RDMA).
    pub cuda: bool,
    /// DMA-BUF file descriptors.
    pub dmabuf: bool,
}

/// NCCL's `NCCL_PTR_HOST` bit of `ncclNetProperties_t::ptrSupport`.
pub const NCCL_PTR_HOST: i32 = 0x1;
/// NCCL's `NCCL_PTR_CUDA` bit: device pointers may be registered by address.
pub const NCCL_PTR_CUDA: i32 = 0x2;
/// NCCL's `NCCL_PTR_DMABUF` bit: device memory may be registered through a
/// DMA-BUF file descriptor (`reg_mr_dmabuf`).
pub const NCCL_PTR_DMABUF: i32 = 0x4;

impl PtrSupport {
    /// As NCCL's `ptrSupport` bit mask (`NCCL_PTR_*`).
    pub fn bits(self) -> i32 {
        (if self.host { NCCL_PTR_HOST } else { 0 })
            | (if self.cuda { NCCL_PTR_CUDA } else { 0 })
            | (if self.dmabuf { NCCL_PTR_DMABUF } else { 0 })
    }

    /// From NCCL's `ptrSupport` bit mask (unknown bits are ignored).
    pub fn from_bits(bits: i32) -> PtrSupport {
        PtrSupport {
            host: bits & NCCL_PTR_HOST != 0,
            cuda: bits & NCCL_PTR_CUDA != 0,
            dmabuf: bits & NCCL_PTR_DMABUF != 0,
        }
    }
}

/// What a transport can do, so the engine never has to guess.
#[derive(Clone, Debug, PartialEq)]
pub struct Properties {
    /// Short name, e.g. `"Socket"`, `"IB"`, `"Mem"`.
    pub name: String,
    /// Link speed in Mbit/s (NCCL's unit), 0 if unknown.
    pub speed_mbps: u64,
    /// One-way latency estimate in microseconds, 0.0 if unknown.
    pub latency_us: f64,
    /// Pointer kinds accepted by `isend` / `irecv`.
    pub ptr_support: PtrSupport,
    /// Whether buffers must be registered with `reg_mr` before use.
    pub needs_registration: bool,
    /// Largest single message `isend` accepts.
    pub max_message_bytes: usize,
    /// How many requests may be outstanding on one comm.
    pub max_requests: usize,
}

/// Errors a transport reports. Each names what failed; the engine adds the
/// rank, peer and operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Io {
        /// The call, e.g. `"connect"`.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The peer closed the connection.
    #[error("connection closed by peer {0}")]
    Closed(String),
    /// The handle bytes could not be decoded.
    #[error("invalid connection handle: {0}")]
    BadHandle(String),
    /// The n-th message carried another tag than the n-th receive.
    #[error("tag mismatch: expected tag {expected}, peer sent {got}")]
    TagMismatch {
        /// Tag of the posted receive.
        expected: u32,
        /// Tag the sender used.
        got: u32,
    },
    /// The incoming message is larger than the posted receive buffer.
    #[error("message of {got} bytes does not fit a receive of {posted} bytes")]
    Truncated {
        /// Posted receive size.
        posted: usize,
        /// Incoming size.
        got: usize,
    },
    /// The peer sent bytes that do not follow the wire format.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The transport cannot do this (e.g. DMA-BUF registration on a
    /// transport whose properties do not offer it).
    #[error("not supported by this transport: {0}")]
    Unsupported(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl NetError {
    /// Wraps an I/O error with the name of the call that failed.
    pub fn io(call: &'static str, source: std::io::Error) -> Self {
        NetError::Io { call, source }
    }
}

/// Result of transport calls.
pub type NetResult<T> = Result<T, NetError>;

/// A request returned by `isend` / `irecv`, to be passed to `test` on the
/// same comm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request(pub u64);

/// A memory registration returned by `reg_mr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemHandle(pub u64);

/// A completed receive, as reported by [`RecvComm::test_lend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// This many bytes were written into the posted buffer.
    Copied(usize),
    /// The bytes were left where the transport holds them (a shared-memory
    /// ring): the message is `first` followed by `second` (empty unless it
    /// wraps). They stay valid and unchanged until [`RecvComm::release`] is
    /// called for the request; the posted buffer was not written.
    Lent {
        /// First part of the message.
        first: (*const u8, usize),
        /// Rest of the message (`(ptr, 0)` when it is all in `first`).
        second: (*const u8, usize),
    },
}

impl Received {
    /// The message length.
    pub fn len(&self) -> usize {
        match *self {
            Received::Copied(n) => n,
            Received::Lent { first, second } => first.1 + second.1,
        }
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A transport: a factory for listeners and connectors. Shared by all
/// communicators of a process.
pub trait Net: Send + Sync + fmt::Debug {
    /// The transport's capabilities. Never blocks.
    fn properties(&self) -> Properties;

    /// Starts listening for one incoming connection. Makes local system calls
    /// only (bind, listen); never waits for a peer.
    fn listen(&self) -> NetResult<Box<dyn Listener>>;

    /// Starts connecting to the listener described by `handle`. Never
    /// blocks: the returned [`Connector`] is polled until it completes.
    fn connect(&self, handle: &[u8]) -> NetResult<Box<dyn Connector>>;
}

/// The receiving end of a connection being set up.
pub trait Listener: Send {
    /// Opaque bytes (at most [`MAX_HANDLE_BYTES`]) that the sender passes to
    /// [`Net::connect`]. Never blocks.
    fn handle(&self) -> &[u8];

    /// Polls for the incoming connection. Never blocks: returns `Ok(None)`
    /// until the peer has connected.
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>>;
}

/// The sending end of a connection being set up.
pub trait Connector: Send {
    /// Polls the connection. Never blocks: returns `Ok(None)` until it is
    /// established.
    fn poll_connect(&mut self) -> NetResult<Option<Box<dyn SendComm>>>;
}

/// The sending half of an established connection. Dropping it closes it.
pub trait SendComm: Send {
    /// Registers memory for sending. A no-op returning a dummy handle for
    /// transports whose properties say `needs_registration == false`. May
    /// make short local system calls; never waits for a peer.
    fn reg_mr(&mut self, ptr: *const u8, len: usize) -> NetResult<MemHandle>;

    /// Registers `len` bytes of device memory at `data` through a DMA-BUF
    /// (NCCL's `regMrDmaBuf`, net plugin v6+): `offset` is the byte offset
    /// of `data` inside the DMA-BUF `fd`; peers address the memory by
    /// `data` (the device virtual address). Only transports whose
    /// [`PtrSupport::dmabuf`] is set implement it; the default reports
    /// [`NetError::Unsupported`]. The handle is released with `dereg_mr`.
    /// The transport does not keep `fd` open past this call (the kernel
    /// keeps the buffer alive for the registration).
    fn reg_mr_dmabuf(
        &mut self,
        data: *const u8,
        len: usize,
        offset: u64,
        fd: i32,
    ) -> NetResult<MemHandle> {
        let _ = (data, len, offset, fd);
        Err(NetError::Unsupported("DMA-BUF registration".into()))
    }

    /// Releases a registration. Never blocks.
    fn dereg_mr(&mut self, mr: MemHandle) -> NetResult<()>;

    /// Posts a send of `len` bytes at `data` with `tag`. Never blocks: it
    /// returns `Ok(None)` when the transport has no room for another request
    /// (call again later) and otherwise a request for [`SendComm::test`].
    ///
    /// # Safety
    /// `data..data+len` must be valid for reads, and must not be written,
    /// until `test` has reported this request complete or the comm has been
    /// dropped. `mr`, if given, must cover the range.
    unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: u32,
        mr: Option<MemHandle>,
    ) -> NetResult<Option<Request>>;

    /// Makes progress and reports whether `req` is complete (`Ok(true)`).
    /// Never blocks. Once it returned `Ok(true)` the request is gone.
    fn test(&mut self, req: Request) -> NetResult<bool>;

    /// A probe of this connection's link counters (retransmits), for
    /// observers on other threads; `None` (the default) where the transport
    /// has none (shared memory). Called once, after connecting.
    fn link_probe(&self) -> Option<SharedProbe> {
        None
    }

    /// A hint for the sends posted from now on (see [`CopyHint`]).
    /// Transports without a single-copy path ignore it; the default does
    /// nothing. Never affects correctness.
    fn hint_copy(&mut self, hint: CopyHint) {
        let _ = hint;
    }

    /// The next request posted (an `isend` that returns one) reports its
    /// NetPlugin profiler events through `p` until it completes; `None`
    /// takes back a profile no request took. Transports without such
    /// events ignore it (the default). Never affects correctness.
    fn profile(&mut self, p: Option<NetProfile>) {
        let _ = p;
    }

    /// Largest message [`SendComm::send_eager`] takes; 0 (the default):
    /// this transport has no eager path.
    fn eager_max(&self) -> usize {
        0
    }

    /// Sends `len <= eager_max()` bytes at `data` with `tag` at once,
    /// complete when it returns `Ok(true)` (no request to test): the tiny
    /// message path. `Ok(false)`: not now (no room, or earlier sends still
    /// queued, which keep their order); call again. Never blocks. The
    /// default says `Ok(false)`.
    ///
    /// # Safety
    /// `data..data+len` must be valid for reads for the duration of the
    /// call.
    unsafe fn send_eager(&mut self, data: *const u8, len: usize, tag: u32) -> NetResult<bool> {
        let _ = (data, len, tag);
        Ok(false)
    }
}

/// How the sends posted from now on travel: the caller's plan for them
/// (it knows what the data is for and what else this rank has to do).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyHint {
    /// The receiver may copy them straight out of our buffer (a single
    /// copy) rather than through the transport's own buffers, where the
    /// transport offers that.
    pub single_copy: bool,
    /// Messages of at most this many bytes go through the transport's own
    /// buffers even where they may go single copy.
    pub buffered_max: usize,
    /// This rank has nothing else to do while the receiver reads them, so
    /// the transport may spend its time copying part of each message into
    /// the receiver itself.
    pub sender_idle: bool,
    /// This rank also receives during the call, so its core is busy with
    /// receive copies: a transport that would otherwise leave every copy
    /// to the receiver (the TCP transport's spliced sends) copies its own
    /// share instead. `false` (the default) where nobody says.
    pub receives: bool,
    /// Copies into the transport's own buffers use streaming
    /// (non-temporal) stores, which do not wait for each line to come back
    /// from the receiver's cache. `false` (the default): plain stores.
    pub streaming_stores: bool,
}

/// How the receives posted from now on may be copied in: a hint from the
/// caller, who knows what the memory is for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvHint {
    /// Addresses `[start, end)` that the caller will not read again soon
    /// (a collective's output, larger than the caches): a transport that
    /// copies a message into a buffer lying wholly inside may use streaming
    /// (non-temporal) stores, which skip reading every destination line
    /// first. Empty (the default): none.
    pub stream: (usize, usize),
}

impl RecvHint {
    /// Whether `data..data+len` lies wholly inside [`RecvHint::stream`].
    pub fn streams(&self, data: *const u8, len: usize) -> bool {
        let (start, end) = self.stream;
        let a = data as usize;
        start <= a && a.checked_add(len).is_some_and(|e| e <= end) && start < end
    }
}

/// The receiving half of an established connection. Dropping it closes it.
pub trait RecvComm: Send {
    /// Registers memory for receiving; see [`SendComm::reg_mr`].
    fn reg_mr(&mut self, ptr: *mut u8, len: usize) -> NetResult<MemHandle>;

    /// Registers device memory for receiving through a DMA-BUF; see
    /// [`SendComm::reg_mr_dmabuf`]. The default reports
    /// [`NetError::Unsupported`].
    fn reg_mr_dmabuf(
        &mut self,
        data: *mut u8,
        len: usize,
        offset: u64,
        fd: i32,
    ) -> NetResult<MemHandle> {
        let _ = (data, len, offset, fd);
        Err(NetError::Unsupported("DMA-BUF registration".into()))
    }

    /// Releases a registration. Never blocks.
    fn dereg_mr(&mut self, mr: MemHandle) -> NetResult<()>;

    /// Posts a receive of at most `len` bytes into `data`, expecting `tag`.
    /// Never blocks; `Ok(None)` means "no room, call again".
    ///
    /// # Safety
    /// `data..data+len` must be valid for writes and must not be accessed by
    /// anyone else until `test` has reported this request complete or the
    /// comm has been dropped.
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: u32,
        mr: Option<MemHandle>,
    ) -> NetResult<Option<Request>>;

    /// Makes progress and reports `Ok(Some(bytes_received))` once `req` is
    /// complete. Never blocks. Once it returned `Some` the request is gone.
    fn test(&mut self, req: Request) -> NetResult<Option<usize>>;

    /// As [`RecvComm::irecv`], for a caller that only reads the message
    /// once: the transport may lend it in place instead of copying it into
    /// `data` (see [`RecvComm::test_lend`]). Such a request is tested only
    /// with `test_lend`. The default is `irecv`.
    ///
    /// # Safety
    /// As for [`RecvComm::irecv`].
    unsafe fn irecv_lend(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: u32,
        mr: Option<MemHandle>,
    ) -> NetResult<Option<Request>> {
        // SAFETY: the caller upholds `irecv`'s contract.
        unsafe { self.irecv(data, len, tag, mr) }
    }

    /// As [`RecvComm::test`] for a request posted with
    /// [`RecvComm::irecv_lend`]. A [`Received::Lent`] answer must be
    /// followed by [`RecvComm::release`] once the caller is done reading;
    /// until then later messages on this comm may wait. The default is
    /// `test`, reporting [`Received::Copied`].
    fn test_lend(&mut self, req: Request) -> NetResult<Option<Received>> {
        Ok(self.test(req)?.map(Received::Copied))
    }

    /// Gives lent bytes back (after [`Received::Lent`]); a no-op for a
    /// request whose bytes were copied. The default does nothing.
    fn release(&mut self, req: Request) -> NetResult<()> {
        let _ = req;
        Ok(())
    }

    /// A probe of this connection's link counters; see
    /// [`SendComm::link_probe`]. The default has none.
    fn link_probe(&self) -> Option<SharedProbe> {
        None
    }

    /// A hint for the receives posted from now on (see [`RecvHint`]).
    /// Transports that copy nothing themselves ignore it; the default does
    /// nothing. Never affects correctness.
    fn hint_recv(&mut self, hint: RecvHint) {
        let _ = hint;
    }

    /// As [`SendComm::profile`], for the next receive posted (`irecv` or
    /// `irecv_lend`).
    fn profile(&mut self, p: Option<NetProfile>) {
        let _ = p;
    }

    /// Largest message [`RecvComm::recv_eager`] takes; 0 (the default):
    /// this transport has no eager path.
    fn eager_max(&self) -> usize {
        0
    }

    /// Receives the next message, of at most `len <= eager_max()` bytes and
    /// expecting `tag`, into `data` if it has arrived: `Ok(Some(bytes))`,
    /// complete; `Ok(None)`: not yet, call again. Only while no receive is
    /// posted (an error otherwise). A message of another tag or a longer
    /// one fails as `test` would. Never blocks. The default says `Ok(None)`:
    /// call it only where `eager_max` allows.
    ///
    /// # Safety
    /// `data..data+len` must be valid for writes for the duration of the
    /// call.
    unsafe fn recv_eager(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: u32,
    ) -> NetResult<Option<usize>> {
        let _ = (data, len, tag);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptr_support_bits_match_nccl() {
        let all = PtrSupport {
            host: true,
            cuda: true,
            dmabuf: true,
        };
        assert_eq!(all.bits(), 0x7);
        assert_eq!(PtrSupport::default().bits(), 0);
        for b in 0..8 {
            assert_eq!(PtrSupport::from_bits(b).bits(), b);
        }
        assert_eq!(
            PtrSupport::from_bits(NCCL_PTR_HOST | NCCL_PTR_DMABUF | 0x100),
            PtrSupport {
                host: true,
                cuda: false,
                dmabuf: true
            }
        );
    }
}
