//! Shared-memory transport for ranks on the same host: [`ShmNet`], NCCL's
//! SHM transport shaped as an [`nccl_net::Net`].
//!
//! # Set-up
//! * [`Net::listen`] (receiving side) creates a POSIX shared-memory segment
//!   `/dev/shm/nccl-rs-<pid>-<random>` (mode 0600): a header page, then a
//!   ring of `slots` slots of `buffsize / slots` bytes ([`ShmOptions`]). The
//!   header holds a magic and layout version, a random nonce, the geometry,
//!   each side's pid, pid namespace and `closed` flag, and the two ring
//!   counters, each written by one side only and on cache lines of their
//!   own. The handle (at most 128 bytes) carries the name, the size and the
//!   nonce.
//! * [`Net::connect`] (sending side) maps the segment, checks size, magic,
//!   version, nonce and geometry, claims the sending side with a
//!   compare-exchange on its pid (so a second connector is refused), and
//!   unlinks the name. [`nccl_net::Listener::accept`] yields the receive
//!   comm once the connector's pid is there (and unlinks the name too, which
//!   is then a no-op). So no name outlives the connection; a listener
//!   dropped unconnected unlinks its name; and [`ShmNet::new`] sweeps the
//!   names left by listeners that died before anyone connected
//!   (`nccl-rs-<pid>-*` with `pid` dead in our pid namespace). The memory
//!   itself is freed by the kernel when the last mapping goes, even if a
//!   process is killed.
//!
//! # Ring protocol
//! One sender (producer) and one receiver (consumer) share a byte ring of
//! `R` bytes and two monotonically increasing `u64` byte counters, `head`
//! (written only by the producer) and `tail` (written only by the consumer).
//! Stream byte `i` lives at ring offset `i % R`. Invariant:
//! `tail <= head <= tail + R`.
//!
//! * **Produce.** The producer may write stream bytes `[head, tail + R)`:
//!   they are free. It copies straight from the caller's send buffer into
//!   the ring, then publishes with `head.store(new, Release)`.
//! * **Consume.** The consumer loads `head` with `Acquire`; the Release /
//!   Acquire pair makes every byte the producer wrote before that store
//!   visible, so it copies `[tail, head)` straight into the caller's receive
//!   buffer, then releases the bytes with `tail.store(new, Release)`.
//! * **Reuse.** The producer loads `tail` with `Acquire` before writing over
//!   released bytes; that pair orders the consumer's reads before the
//!   producer's overwrites.
//!
//! Each side keeps its own counter locally and caches the other's, reloading
//! it only when the cached value does not show enough data or room, so the
//! counter lines move between cores only when needed. The producer publishes
//! after every 16 KiB piece it copies in (so the consumer copies a message
//! out while the rest is still being copied in), the consumer when a slot
//! empties and at the end of every poll: messages larger than the whole ring
//! stream through it as slots free up. A counter out of range
//! (a corrupt or hostile peer) is a [`NetError::Protocol`] error, never an
//! out-of-bounds access.
//!
//! # Frames
//! Every message is a frame starting at a 64-byte-aligned stream offset: a
//! 16-byte header (tag `u32`, a frame mark `u32`, length `u64`, all
//! little-endian) in the first 64-byte line; a payload of up to 48 bytes
//! rides in the rest of that line (one line per small message); a longer
//! payload follows from the next line on. Frames are padded to 64 bytes, so
//! a header never straddles the end of the ring or of a slot. Receives are
//! matched to frames in posting order; a different tag is
//! [`NetError::TagMismatch`], a longer message [`NetError::Truncated`];
//! either ends the connection.
//!
//! # Sealed frames (small messages)
//! `send_eager` writes a message of up to 4 KiB (less than half the ring)
//! as one frame at once: payload (inline, or in the lines after the
//! header), header, then the header line's last word, stored with
//! `Release`, which seals it: a keyed bijection of its stream position
//! (`ring`'s `seal` module). `recv_eager` loads the word at its tail with
//! `Acquire`; the seal of that very position means the frame is complete,
//! and the consumer reads it before the producer's counter covers it (which
//! `avail` allows for). Anything else there (an earlier lap's seal, payload
//! bytes) falls back to the counter; so do inline payloads of 41 to 48
//! bytes, which would reach the seal's word and go unsealed. The producer
//! publishes its counter for sealed frames too, so every reader sees them
//! in order.
//!
//! # Reducing in place
//! A receive posted with [`nccl_net::RecvComm::irecv_lend`] (the engine
//! does so for data it only reduces) whose ring payload fits the ring is not
//! copied out: once the whole payload is published, `test_lend` lends it
//! where it lies (two pieces where it wraps) and the consumer counter stays
//! before it until `release`, so the producer cannot overwrite it. Later
//! frames wait meanwhile. It saves copying the data into a staging slot
//! before reducing it ([`ShmOptions::direct_reduce`]).
//!
//! # Streaming receives
//! The engine says which memory it will not read again soon
//! ([`nccl_net::RecvComm::hint_recv`]: the output of a call that neither
//! reduces nor relays, from half the last-level cache on); a ring payload,
//! or a single-copy message read through a mapping, copied into a receive
//! buffer inside it goes with streaming stores (pieces of at least 1 KiB),
//! which skip reading each destination line before writing it
//! (`cargo test --release -p nccl-rs --test shm bench::bench_stream_receive -- --ignored` compares the two).
//!
//! # Single copy
//! With [`ShmOptions::cma`] (`NCCL_RS_SHM_SINGLE_COPY`, on by default), a message
//! of at least [`ShmOptions::cma_min_bytes`] travels as a one-line
//! descriptor frame (mark `CMA1`, the sender's buffer address) and the
//! receiver copies it with `process_vm_readv` straight from the sender's
//! buffer (see the `cma` module). Whether that is allowed is probed once per
//! connection at accept; it falls back to the ring when the probe fails.
//! The caller's plan allows it per call (see below).
//!
//! A message that lies in one of the sender's shared allocations
//! (`ncclMemAlloc`, `ShmBuffer`) also names that allocation in its frame,
//! and the receiver maps it (once, kept) and copies with `memcpy` instead
//! (see the `mapped` module); send/recv groups from such buffers then go
//! single copy at any size: one `memcpy` from a mapping, without a system
//! call, replaces the ring's two copies.
//!
//! # Split single copy
//! A sender the engine calls idle (it only waits for its sends to be read,
//! as a broadcast root does) flags its single-copy frames of at least 128 KiB;
//! the receiver then offers the message in pieces and both ends copy runs of
//! it, the sender with `process_vm_writev` into the receiver's buffer (see
//! the `split` module; [`ShmOptions::cma_split`]), so an idle core shares
//! the copy. The sender probes at connect that it may access the receiver,
//! through a probe word the receiver publishes.
//!
//! # Which path a message takes
//! The caller's plan decides, per call ([`nccl_net::SendComm::hint_copy`],
//! `plan::call`): whether messages may go single copy, up to which size
//! they take the ring anyway, and whether ring copies use streaming stores.
//! The transport only carries it out, with what it knows of each message:
//! whether the receiver's probe allows single copy, whether the message
//! lies in shared memory (mapped), and whether the sender helps (split).
//!
//! # Progress and peer death
//! `isend` queues the request and writes as much as fits; `irecv` only
//! queues; `test` on either side moves as many bytes as it can and never
//! waits. When a poll moves nothing while requests are pending, it looks at
//! the peer's `closed` flag (set when the peer's comm or listener is
//! dropped) and, every 1000 such polls or 10 ms, checks that the peer's pid
//! still exists and is not a zombie. A peer that is gone, once its published
//! bytes are drained, gives [`NetError::Closed`]`("shm peer pid N")`.
//! Waiting strategy (spin, yield, block) is the caller's business.
//!
//! [`NetError::Protocol`]: nccl_net::NetError::Protocol
//! [`NetError::TagMismatch`]: nccl_net::NetError::TagMismatch
//! [`NetError::Truncated`]: nccl_net::NetError::Truncated
//! [`NetError::Closed`]: nccl_net::NetError::Closed

mod cma;
mod comm;
mod connect;
mod handle;
mod mapped;
mod peer;
mod recv;
mod ring;
mod segment;
mod send;
mod split;
#[cfg(test)]
mod tests;

use connect::{ShmConnector, ShmListener};
use nccl_net::{Connector, Listener, Net, NetResult, Properties, PtrSupport};
use segment::Geometry;

/// Default ring size per connection (NCCL's `NCCL_BUFFSIZE`).
pub const DEFAULT_BUFFSIZE: usize = 4 << 20;
/// Default number of slots the ring is divided into.
pub const DEFAULT_SLOTS: usize = 8;
/// Requests that may be outstanding on one comm (NCCL's
/// `NCCL_NET_MAX_REQUESTS`); `isend` / `irecv` return `Ok(None)` beyond.
pub const MAX_REQUESTS: usize = 32;
/// Default single-copy threshold: messages of at least this many bytes are
/// read by the receiver straight from the sender's buffer
/// (`process_vm_readv`) instead of being copied through the ring. Below it
/// the system call costs more than the second copy it saves (fitted on a
/// 2-core VM; refit on real hardware with `scripts/paired.sh`).
pub const DEFAULT_CMA_MIN_BYTES: usize = 16 << 10;
/// Largest single message (1 TiB, or the address space on 32-bit targets).
pub const MAX_MESSAGE_BYTES: usize = if usize::BITS > 40 {
    1 << 40
} else {
    usize::MAX / 2
};
/// Speed reported in [`Properties`] (Mbit/s): a conservative figure for a
/// copy-in / copy-out ring between two cores.
const SPEED_MBPS: u64 = 80_000;
/// One-way latency of a small message through the ring (µs), polling.
const LATENCY_US: f64 = 0.5;

/// Settings of the shared-memory transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmOptions {
    /// Ring bytes per connection (`NCCL_BUFFSIZE`; default 4 MiB).
    pub buffsize: usize,
    /// Slots the ring is divided into (default 8). A slot (`buffsize /
    /// slots`, rounded down to 64 bytes) is the pipelining step of large
    /// messages.
    pub slots: usize,
    /// Whether large messages may go single-copy by cross-memory attach
    /// (`NCCL_RS_SHM_SINGLE_COPY`, on in the default `Config`; false in
    /// `ShmOptions::default()`). Used only where a probe at
    /// connection time shows that the receiver may read the sender.
    pub cma: bool,
    /// Messages of at least this many bytes go single-copy
    /// (`NCCL_RS_SHM_SINGLE_COPY_MIN_BYTES`; default [`DEFAULT_CMA_MIN_BYTES`]).
    pub cma_min_bytes: usize,
    /// Whether both ends copy a large single-copy message, each a part
    /// (default true): the sender, which otherwise waits, writes into the
    /// receiver's buffer while the receiver reads.
    pub cma_split: bool,
    /// Whether a receive whose data is only reduced may be read in place in
    /// the ring instead of copied out first (default true).
    pub direct_reduce: bool,
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            buffsize: DEFAULT_BUFFSIZE,
            slots: DEFAULT_SLOTS,
            cma: false,
            cma_min_bytes: DEFAULT_CMA_MIN_BYTES,
            cma_split: true,
            direct_reduce: true,
        }
    }
}

/// The shared-memory transport: any number of connections between
/// processes (or threads) of one host.
#[derive(Debug)]
pub struct ShmNet {
    opts: ShmOptions,
    geom: Geometry,
}

impl ShmNet {
    /// Checks `opts` and removes stale segments left in `/dev/shm` by dead
    /// processes.
    pub fn new(opts: ShmOptions) -> NetResult<ShmNet> {
        let geom = Geometry::new(opts.buffsize, opts.slots)?;
        let removed = segment::sweep_stale();
        if removed > 0 {
            tracing::info!(removed, "SHM: removed stale segments");
        }
        Ok(ShmNet { opts, geom })
    }

    /// The settings in use.
    pub fn options(&self) -> &ShmOptions {
        &self.opts
    }

    /// The single-copy settings, `None` when single copy is off.
    fn cma_opts(&self) -> Option<cma::CmaOpts> {
        self.opts.cma.then_some(cma::CmaOpts {
            min: self.opts.cma_min_bytes,
            split: self.opts.cma_split,
        })
    }
}

impl Net for ShmNet {
    fn properties(&self) -> Properties {
        Properties {
            name: "SHM".into(),
            speed_mbps: SPEED_MBPS,
            latency_us: LATENCY_US,
            ptr_support: PtrSupport {
                host: true,
                ..Default::default()
            },
            needs_registration: false,
            max_message_bytes: MAX_MESSAGE_BYTES,
            max_requests: MAX_REQUESTS,
        }
    }

    fn listen(&self) -> NetResult<Box<dyn Listener>> {
        Ok(Box::new(ShmListener::new(
            self.geom,
            self.cma_opts(),
            self.opts.direct_reduce,
        )?))
    }

    fn connect(&self, handle: &[u8]) -> NetResult<Box<dyn Connector>> {
        Ok(Box::new(ShmConnector::connect(handle, self.cma_opts())?))
    }
}

/// Fuzzing: decodes a shared-memory connection handle.
pub(crate) fn fuzz_handle(data: &[u8]) {
    let _ = handle::ShmHandle::decode(data);
}

/// CPUs online on this host: the measure of oversubscription
/// (`plan::Topology::oversubscribed`). Not this process's affinity mask
/// (`available_parallelism`): a launcher that binds each rank to one CPU
/// would make every rank look alone on a 1-CPU machine.
pub(crate) fn online_cpus() -> usize {
    // SAFETY: sysconf only reads a system value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(1)
}

/// The one CPU this process may run on, where it is bound to exactly one
/// (a launcher's `--bind core`); `None` otherwise.
pub(crate) fn bound_cpu() -> Option<u32> {
    // SAFETY: an all-zero `cpu_set_t` is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live `cpu_set_t` of the size passed, for the call
    // to fill; pid 0 is this thread.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return None;
    }
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| {
        // SAFETY: `c` is below `CPU_SETSIZE`, the set's capacity.
        unsafe { libc::CPU_ISSET(c, &set) }
    });
    match (cpus.next(), cpus.next()) {
        (Some(c), None) => u32::try_from(c).ok(),
        _ => None,
    }
}
