//! The call plan: how one call travels, decided in one place.
//!
//! [`plan_call`] takes what is known about a call — the collective and its
//! buffers ([`CallFacts`]), the communicator's topology ([`Topology`]) and
//! where the peer's CPU is ([`Placement`]) — and returns a [`CallPlan`]:
//! the algorithm and its schedule shape, the staging of the input, how the
//! messages to every peer move (through the transport's ring, single copy,
//! or from a mapping), and the kind of stores each copy uses. It has no I/O
//! and no clock; the communicator gathers the facts and runs the plan, and
//! the engine and the transports decide nothing about the path.
//!
//! # The rules
//! Single copy (the receiver reads the sender's buffer once, by
//! `process_vm_readv` or from a mapping) needs every rank on one host over
//! shared memory, with single copy on at every rank ([`Topology::single_copy`]).
//! - Reductions never go single copy: the receiver reduces straight out of
//!   the ring, which a second copy would only delay.
//! - All-to-all goes single copy at any size, in one message per peer: it
//!   has no pipeline a ring would feed.
//! - All-gather between two ranks, or with more local ranks than CPUs, goes
//!   single copy in one hop (each block once to every peer).
//! - Broadcast between two ranks goes single copy in one message; the root,
//!   idle otherwise, copies half of it into the reader.
//! - Anything else that does not reduce goes single copy up to
//!   `NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES` (a quarter of it on a rank that
//!   only sends), and past it only from shared buffers (read by `memcpy`).
//! - With more local ranks than CPUs ([`Topology::oversubscribed`]), only
//!   all-to-all and the one-hop all-gather above 64 KiB go single copy:
//!   below, and for other calls, the ring's two copies cost the one core
//!   less than a system call per message; their heap inputs are first
//!   copied into shared staging, which the readers map.
//!
//! Placement (see [`super::placement`]) decides the rest, between two
//! ranks on their own CPUs:
//! - **Near** (a shared last-level cache): messages that may go single copy
//!   travel through the ring up to 1 MiB from a rank that only sends, up to
//!   64 KiB from one that also receives, and an all-gather or all-to-all
//!   of half the last-level cache or more takes the ring in chunks; the
//!   copies stay in the cache the reader reads them from.
//! - **Apart**: ring messages are written with streaming stores (a plain
//!   store would wait for each line to come back from the reader's cache);
//!   messages that may go single copy travel the ring only up to 64 KiB;
//!   large all-gathers and all-to-alls go single copy in whole blocks.
//! - **Unknown**: none of these.
//!
//! Outputs of at least half the last-level cache are written with
//! streaming stores (received messages only for calls that neither reduce
//! nor relay): the caller will not read them again soon.

use super::placement::Placement;
use super::{Choice, Coll, Planner};
use crate::datatype::DataType;
use crate::schedule::{Loc, Schedule, Step};

/// Messages that may go single copy travel through the ring instead, up to
/// this size, while the two CPUs share a cache and the sender only sends:
/// two copies within the cache, one on each core, cost less than a system
/// call and a copy from the other core's memory.
pub(crate) const NEAR_RING_MAX_BYTES: usize = 1 << 20;
/// The same while the CPUs are apart, with streaming stores: up to here the
/// ring's streamed copy still beats the system call of single copy.
pub(crate) const APART_RING_MAX_BYTES: usize = 64 << 10;
/// With more local ranks than CPUs, all-to-all and the one-hop all-gather
/// go single copy only above this size (below, the ring's copies cost the
/// shared core less than a system call per message).
pub(crate) const OVERSUBSCRIBED_MIN_BYTES: usize = 64 << 10;
/// With more local ranks than CPUs, all-to-all staging copies of at least this many
/// bytes stream; below, the readers find the staged copy in the cache.
pub(crate) const OVERSUBSCRIBED_STREAM_MIN_BYTES: usize = 2 << 20;
/// Largest all-to-all input copied into shared staging: a bound on the
/// staging memory a communicator keeps.
pub(crate) const STAGED_ALL_TO_ALL_MAX_BYTES: usize = 256 << 20;
/// A rank that only sends copies part of a message into its reader only if
/// it has no local work, or its output is at least this large (a local copy
/// of a larger output is better done after the sends).
pub(crate) const IDLE_COPY_MIN_BYTES: usize = 2 << 20;
/// Chunk of a broadcast over sockets: it receives straight into the
/// output, and larger messages cost fewer system calls per byte.
pub(crate) const SOCKET_BROADCAST_CHUNK_BYTES: usize = 2 << 20;
/// Calls whose messages are at least this large depend on placement (ring
/// stores, ring or single copy) even below [`Topology::stream_from`].
pub(crate) const PLACEMENT_MIN_BYTES: usize = 16 << 10;
/// Such calls re-measure placement once in this many calls (the two ranks
/// count alike); the calls between reuse the last verdict. A measurement
/// costs more than its round trips (it holds up the calls queued behind
/// it), while where the OS runs two ranks changes seldom in that many calls.
pub(crate) const PLACEMENT_EVERY: u64 = 1024;

/// The kind of link a peer is reached over, with its own cost constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum LinkClass {
    /// Shared memory within one host.
    SharedMemory,
    /// The in-memory transport of tests (threads of one process).
    Memory,
    /// A network link through one switch (the same leaf).
    SameLeaf,
    /// A network link across the spine, whose uplinks are oversubscribed
    /// by this factor (1.0: non-blocking). Fabric topology (multi-host)
    /// supplies it; nothing on one host does.
    #[allow(dead_code)]
    Spine { oversubscription: f64 },
}

impl LinkClass {
    /// The class of a transport by its name (`Properties::name`).
    pub(crate) fn of_transport(name: &str) -> LinkClass {
        match name {
            "SHM" => LinkClass::SharedMemory,
            "Mem" => LinkClass::Memory,
            _ => LinkClass::SameLeaf,
        }
    }

    /// The cost constants of this link (see [`super::Model`]).
    pub(crate) fn model(self) -> super::Model {
        use super::Model;
        match self {
            // Fitted by `scripts/fit-model.sh` (2-rank sendrecv, 8 B-8 MiB).
            LinkClass::SharedMemory => Model {
                alpha: 0.7e-6,
                beta: 5.3e9,
            },
            LinkClass::Memory => Model {
                alpha: 1e-6,
                beta: 10e9,
            },
            LinkClass::SameLeaf => Model {
                alpha: 5.2e-6,
                beta: 4.3e9,
            },
            LinkClass::Spine { oversubscription } => Model {
                alpha: 2.0 * 5.2e-6,
                beta: 4.3e9 / oversubscription.max(1.0),
            },
        }
    }
}

/// What does not change from call to call: the communicator's ranks,
/// links and host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Topology {
    pub(crate) nranks: usize,
    pub(crate) rank: usize,
    /// Every peer is on this host over shared memory and every rank has
    /// single copy on (agreed at connect).
    pub(crate) single_copy: bool,
    /// More local ranks than CPUs.
    pub(crate) oversubscribed: bool,
    /// The ranks talk over sockets.
    pub(crate) sockets: bool,
    /// Largest call (bytes of this rank's buffers) that goes single copy
    /// under the size rule (`NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES`).
    pub(crate) single_copy_max: usize,
    /// Outputs of at least this many bytes stream
    /// (`NCCL_RS_SHM_STREAM_BYTES`; half the last-level cache).
    pub(crate) stream_from: usize,
    /// Bytes of a staging slot: the pipelining chunk.
    pub(crate) chunk_bytes: usize,
    /// The placement to assume when none is measured.
    pub(crate) placement: Placement,
    /// The peers bound to this rank's own CPU (bit `r` for rank `r`, ranks
    /// 0-63): they read what it writes from its caches.
    pub(crate) sharing_cpu: u64,
}

impl Topology {
    fn pair(&self) -> bool {
        self.nranks == 2
    }
}

/// What the communicator knows about one call's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallFacts {
    /// The collective; `None` for a group of sends and receives.
    pub(crate) coll: Option<Coll>,
    pub(crate) dtype: DataType,
    pub(crate) in_bytes: usize,
    /// Bytes of the output (for a group: of every receive buffer).
    pub(crate) out_bytes: usize,
    /// The input overlaps the output.
    pub(crate) overlaps: bool,
    /// The input starts where the output does.
    pub(crate) in_place: bool,
    /// The input is the output, whole, in blocks of equal size.
    pub(crate) exact_in_place: bool,
    /// The input is plain heap memory: neither a shared allocation (which
    /// readers map) nor registered onto huge pages.
    pub(crate) input_heap: bool,
    /// Every send of a group comes from a shared allocation.
    pub(crate) sends_mapped: bool,
}

/// What a schedule does, as the message rules need it (see
/// [`SchedFacts::of`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SchedFacts {
    /// This rank receives during the call.
    pub(crate) receives: bool,
    /// It does something besides sending (a copy, a reduction).
    pub(crate) local_work: bool,
    /// It sends one message to each peer at most.
    pub(crate) one_message_per_peer: bool,
    /// It relays what it receives.
    pub(crate) forwards: bool,
    /// Some step reduces a received message.
    pub(crate) reduces: bool,
}

impl SchedFacts {
    pub(crate) fn of(sched: &Schedule) -> SchedFacts {
        let mut f = SchedFacts {
            one_message_per_peer: true,
            ..SchedFacts::default()
        };
        let mut peers: Vec<usize> = Vec::new();
        for s in &sched.steps {
            f.receives |= s.recv_peer().is_some();
            f.local_work |= !matches!(s, Step::Send { .. });
            f.forwards |= matches!(
                s,
                Step::RecvCopySend { .. } | Step::RecvReduceCopySend { to: Some(_), .. }
            );
            f.reduces |= s.needs_slot();
            match s {
                Step::Send { to, .. } if !peers.contains(to) => peers.push(*to),
                s if s.send_peer().is_some() => f.one_message_per_peer = false,
                _ => {}
            }
        }
        f
    }

    /// Whether every send of `sched` comes from a buffer that `shared` says
    /// is a shared allocation (`in`, `out`, group buffer `b`).
    pub(crate) fn sends_from(sched: &Schedule, mut shared: impl FnMut(Loc) -> bool) -> bool {
        let mut any = false;
        for s in &sched.steps {
            if let Step::Send { src, .. } = *s {
                any = true;
                if matches!(src, Loc::Scratch(_)) || !shared(src) {
                    return false;
                }
            }
        }
        any
    }
}

/// A schedule of one shape, as the plan sees it: what it does and which
/// algorithm it is (the caller caches both with the schedule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shaped {
    pub(crate) facts: SchedFacts,
    pub(crate) algo: Choice,
}

impl Shaped {
    /// The schedule `sched` of `coll` in `shape` over `nranks`.
    pub(crate) fn of(
        planner: &Planner,
        coll: Coll,
        shape: Shape,
        nranks: usize,
        dtype: DataType,
        sched: &Schedule,
    ) -> Shaped {
        let algo = match shape {
            Shape::Chunked(_) => planner.choice(coll, nranks, dtype),
            Shape::DirectAllGather => Choice::DIRECT,
            Shape::InPlaceAllToAll(_) => Choice::PAIRWISE,
        };
        Shaped {
            facts: SchedFacts::of(sched),
            algo,
        }
    }
}

/// Which schedule a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Shape {
    /// The planner's algorithm, pipelined in chunks of that many elements.
    Chunked(usize),
    /// The one-hop all-gather: each block once to every peer.
    DirectAllGather,
    /// An all-to-all whose input was staged, in chunks of that many
    /// elements: it sends from staging and leaves its own block alone.
    InPlaceAllToAll(usize),
}

/// Plain stores, or streaming (non-temporal) stores that skip the caches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Stores {
    #[default]
    Plain,
    Streaming,
}

/// What is copied into the communicator's shared staging buffer before
/// the call runs, and sent from there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Staging {
    /// Nothing: the call sends from its input.
    #[default]
    None,
    /// The whole input.
    Input(Stores),
    /// Every block but the rank's own (an all-to-all exactly in place,
    /// whose own block is already where it belongs).
    OtherBlocks(Stores),
    /// Every block but the own one, which is copied straight to the output
    /// (an out-of-place all-to-all sent from shared memory).
    OtherBlocksOwnToOutput(Stores),
}

/// How the messages of a call move, to every peer alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Messages {
    /// A message may go single copy (the receiver reads it out of our
    /// buffer; from a mapping when the buffer is shared memory).
    pub(crate) single_copy: bool,
    /// But one of at most this many bytes goes through the ring instead.
    pub(crate) ring_max: usize,
    /// This rank has nothing else to do meanwhile: it may copy part of a
    /// single-copy message into its reader.
    pub(crate) sender_idle: bool,
    /// This rank also receives during the call.
    pub(crate) receives: bool,
    /// The stores that write ring messages.
    pub(crate) ring_stores: Stores,
    /// The stores that copy received messages into the output.
    pub(crate) recv_stores: Stores,
    /// The stores of the rank's own copies into the output.
    pub(crate) copy_stores: Stores,
}

/// How one message of `len` bytes to a peer moves.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Through the transport's own buffers, with these stores.
    Ring(Stores),
    /// Read once by the receiver out of the sender's buffer.
    SingleCopy,
}

impl Messages {
    #[cfg_attr(not(test), allow(dead_code))]
    /// The path of a message of `len` bytes, where the transport offers
    /// single copy from `min` bytes up.
    pub(crate) fn path(&self, len: usize, min: usize) -> Path {
        if self.single_copy && len >= min && len > self.ring_max {
            Path::SingleCopy
        } else {
            Path::Ring(self.ring_stores)
        }
    }
}

/// One call's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallPlan {
    /// The algorithm, as INFO names it.
    pub(crate) algo: Choice,
    /// Parallel channels (one: the schedules are single-channel).
    pub(crate) channels: usize,
    /// The schedule's shape, with its chunking.
    pub(crate) shape: Shape,
    pub(crate) staging: Staging,
    /// Readers (bit `r` for rank `r`) whose staged blocks are copied with
    /// plain stores whatever `staging` says: they run on this rank's CPU
    /// and read the block from its cache.
    pub(crate) staging_plain_for: u64,
    pub(crate) messages: Messages,
}

/// Whether the plan of a `coll` with `in_bytes` of input may stage it (and
/// so needs to know whether the input is plain heap memory: the caller
/// skips that lookup where it cannot matter).
pub(crate) fn may_stage(topo: &Topology, coll: Coll, in_bytes: usize) -> bool {
    let staged_all_to_all = topo.oversubscribed || in_bytes >= topo.stream_from;
    topo.single_copy
        && in_bytes > 0
        && match coll {
            Coll::AllGather { .. } => topo.oversubscribed,
            Coll::AllToAll { .. } => staged_all_to_all,
            _ => false,
        }
}

/// Whether the plan of `call` depends on where the peer's CPU is, and if
/// so whether this call measures it (`Some(true)`) or reuses the last
/// verdict (`Some(false)`); `seq` counts such calls from 0. Both ranks
/// measure together, so this reads only what every rank of the call has
/// alike: the collective and its size, never one rank's buffers.
pub(crate) fn placement_matters(topo: &Topology, call: &CallFacts, seq: u64) -> Option<bool> {
    if !(topo.single_copy && topo.pair() && !topo.oversubscribed) {
        return None;
    }
    let coll = call.coll?;
    let bytes = coll.bytes(topo.nranks, call.dtype);
    let shapes = matches!(
        coll,
        Coll::AllGather { .. } | Coll::AllReduce { .. } | Coll::AllToAll { .. }
    );
    if shapes && bytes >= topo.stream_from {
        // The shape itself depends on it: every call measures.
        return Some(true);
    }
    (bytes >= PLACEMENT_MIN_BYTES).then_some(seq % PLACEMENT_EVERY == 0)
}

/// The single-copy rules of a call of `bytes` (see the module docs).
struct Rules<'a> {
    topo: &'a Topology,
    placement: Placement,
}

impl Rules<'_> {
    fn near(&self) -> bool {
        self.placement == Placement::Near
    }

    /// The call is large enough between two ranks on their own CPUs, every
    /// peer single copy, that placement decides its shape.
    fn shaped_by_placement(&self, bytes: usize) -> bool {
        let t = self.topo;
        t.single_copy && t.pair() && !t.oversubscribed && bytes >= t.stream_from
    }

    /// All-to-all messages go single copy (on the links that offer it).
    fn all_to_all(&self, bytes: usize) -> bool {
        let t = self.topo;
        if self.near() && self.shaped_by_placement(bytes) {
            // Near, large: the ring, in chunks.
            return false;
        }
        let max = t.single_copy_max;
        match (t.single_copy, t.oversubscribed) {
            (true, true) => OVERSUBSCRIBED_MIN_BYTES < bytes,
            (true, false) => true,
            (false, true) => OVERSUBSCRIBED_MIN_BYTES < bytes && bytes <= max.saturating_mul(2),
            (false, false) => bytes <= max,
        }
    }

    /// All-to-all runs in whole blocks, one message per peer (every rank
    /// agrees, so every peer must take single copy).
    fn whole_blocks(&self, bytes: usize) -> bool {
        self.topo.single_copy && self.all_to_all(bytes)
    }

    /// All-gather goes single copy in one hop: between two ranks below the
    /// streaming size (above it the ring in chunks, streamed while apart),
    /// or with more local ranks than CPUs above 64 KiB.
    fn all_gather(&self, bytes: usize) -> bool {
        let t = self.topo;
        let fits = match t.oversubscribed {
            true => OVERSUBSCRIBED_MIN_BYTES < bytes,
            false => t.pair() && bytes < t.stream_from,
        };
        t.single_copy && fits
    }

    /// Broadcast between two ranks goes single copy, the root helping.
    fn broadcast(&self) -> bool {
        let t = self.topo;
        t.single_copy && t.pair() && !t.oversubscribed
    }

    /// An out-of-place all-to-all is sent from shared staging.
    fn stages_all_to_all(&self, bytes: usize) -> bool {
        (self.topo.oversubscribed || bytes >= self.topo.stream_from)
            && bytes <= STAGED_ALL_TO_ALL_MAX_BYTES
            && self.whole_blocks(bytes)
    }

    /// An all-to-all's staging copies of `bytes` stream from the streaming
    /// size, and with more local ranks than CPUs from
    /// [`OVERSUBSCRIBED_STREAM_MIN_BYTES`]:
    /// there the ranks sharing the cache each hold an input, a staged copy
    /// and an output, so a larger copy would not stay in the cache anyway.
    fn staging_stores(&self, bytes: usize) -> Stores {
        let from = match self.topo.oversubscribed {
            true => OVERSUBSCRIBED_STREAM_MIN_BYTES.min(self.topo.stream_from),
            false => self.topo.stream_from,
        };
        let stream = bytes >= from;
        if stream {
            Stores::Streaming
        } else {
            Stores::Plain
        }
    }
}

/// The plan of a collective (see the module docs). `shaped` says what the
/// schedule of a shape does (the caller caches schedules).
pub(crate) fn plan_call(
    planner: &Planner,
    topo: &Topology,
    call: &CallFacts,
    placement: Placement,
    shaped: &mut dyn FnMut(Shape) -> Shaped,
) -> CallPlan {
    let rules = Rules { topo, placement };
    let n = topo.nranks;
    let bytes = call.out_bytes;
    let chunk = (topo.chunk_bytes / call.dtype.size()).max(1);
    let Some(coll) = call.coll else {
        let messages = group_messages(topo, call, placement, shaped(Shape::Chunked(chunk)).facts);
        return CallPlan {
            algo: Choice::RING,
            channels: 1,
            shape: Shape::Chunked(chunk),
            staging: Staging::None,
            staging_plain_for: 0,
            messages,
        };
    };
    // Staging of the input.
    let staging = match coll {
        Coll::AllGather { .. }
            if topo.oversubscribed
                && call.in_bytes > 0
                && !call.overlaps
                && rules.all_gather(bytes)
                && call.input_heap =>
        {
            // Every other rank reads this copy right after it is written:
            // plain stores leave it in the shared cache for them (and
            // `memcpy` itself goes non-temporal past its own threshold).
            Staging::Input(Stores::Plain)
        }
        Coll::AllToAll { .. } if call.in_bytes > 0 => {
            let stores = rules.staging_stores(call.in_bytes);
            match (call.overlaps, call.exact_in_place) {
                (true, true) => Staging::OtherBlocks(stores),
                (true, false) => Staging::Input(stores),
                (false, _)
                    if rules.stages_all_to_all(call.in_bytes)
                        && call.in_bytes == call.out_bytes
                        && call.in_bytes % n.max(1) == 0
                        && call.input_heap =>
                {
                    Staging::OtherBlocksOwnToOutput(stores)
                }
                (false, _) => Staging::None,
            }
        }
        _ => Staging::None,
    };
    // The schedule's shape: one message per peer where it goes single
    // copy (each chunk would cost a handshake), else the planner's chunks.
    let mut shape = match coll {
        Coll::AllToAll { count } if rules.whole_blocks(bytes) => Shape::Chunked(count.max(1)),
        Coll::AllGather { .. } if rules.all_gather(bytes) && planner.allows_direct(coll) => {
            Shape::DirectAllGather
        }
        Coll::Broadcast { count, .. } if rules.broadcast() => Shape::Chunked(count.max(1)),
        Coll::Broadcast { .. } if topo.sockets => {
            Shape::Chunked((SOCKET_BROADCAST_CHUNK_BYTES / call.dtype.size()).max(1))
        }
        _ => Shape::Chunked(chunk),
    };
    if let (Shape::Chunked(c), Staging::OtherBlocks(_) | Staging::OtherBlocksOwnToOutput(_)) =
        (shape, staging)
    {
        shape = Shape::InPlaceAllToAll(c);
    }
    let Shaped { facts: sched, algo } = shaped(shape);
    // How its messages move.
    let single_copy = match coll {
        Coll::AllToAll { .. } => rules.all_to_all(bytes),
        Coll::AllGather { .. } if rules.all_gather(bytes) && sched.one_message_per_peer => true,
        Coll::Broadcast { .. } if rules.broadcast() => true,
        _ => {
            let cap = match sched.receives {
                true => topo.single_copy_max,
                false => topo.single_copy_max / 4,
            };
            !topo.oversubscribed && !coll.reduces() && bytes <= cap
        }
    };
    let mut messages = placed(topo, call, placement, single_copy, sched);
    messages.recv_stores = match bytes >= topo.stream_from && !coll.reduces() && !sched.forwards {
        true => Stores::Streaming,
        false => Stores::Plain,
    };
    // An output larger than the cache is not read again soon.
    messages.copy_stores = match bytes >= topo.stream_from {
        true => Stores::Streaming,
        false => Stores::Plain,
    };
    // Per-block staging (an all-to-all's blocks have one reader each):
    // readers on this rank's own CPU take theirs from its cache.
    let staging_plain_for = match staging {
        Staging::OtherBlocks(Stores::Streaming)
        | Staging::OtherBlocksOwnToOutput(Stores::Streaming) => topo.sharing_cpu,
        _ => 0,
    };
    CallPlan {
        algo,
        channels: 1,
        shape,
        staging,
        staging_plain_for,
        messages,
    }
}

/// The schedule of `coll` in `shape`, for `rank` of `nranks`.
pub(crate) fn schedule_of(
    planner: &Planner,
    coll: Coll,
    shape: Shape,
    nranks: usize,
    rank: usize,
    dtype: DataType,
) -> Schedule {
    match (shape, coll) {
        (Shape::DirectAllGather, Coll::AllGather { send_count }) => {
            crate::schedule::all_gather_direct(nranks, rank, send_count)
        }
        (Shape::InPlaceAllToAll(chunk), Coll::AllToAll { count }) => {
            crate::schedule::all_to_all_in_place(nranks, rank, count, chunk)
        }
        (Shape::Chunked(chunk), _) => planner.plan(coll, nranks, rank, dtype, chunk),
        // The plan never pairs these; the chunked schedule stays correct.
        (_, _) => planner.plan(coll, nranks, rank, dtype, 1 << 16),
    }
}

/// The messages of a send/recv group: single copy up to the cap, or at any
/// size from shared buffers (read by `memcpy` from a mapping).
fn group_messages(
    topo: &Topology,
    call: &CallFacts,
    placement: Placement,
    sched: SchedFacts,
) -> Messages {
    let cap = match sched.receives {
        true => topo.single_copy_max,
        false => topo.single_copy_max / 4,
    };
    let single_copy = !topo.oversubscribed && (call.out_bytes <= cap || call.sends_mapped);
    let mut m = placed(topo, call, placement, single_copy, sched);
    m.recv_stores = match call.out_bytes >= topo.stream_from && !sched.forwards {
        true => Stores::Streaming,
        false => Stores::Plain,
    };
    m
}

/// The placement-dependent part of the messages' paths.
fn placed(
    topo: &Topology,
    call: &CallFacts,
    placement: Placement,
    single_copy: bool,
    sched: SchedFacts,
) -> Messages {
    // While near, a rank that only sends hands messages up to 1 MiB to the
    // ring (its copy overlaps the reader's); one that also receives would
    // make two copies per byte on each core where single copy makes one,
    // so only the small ones.
    let near_max = match sched.receives {
        true => APART_RING_MAX_BYTES,
        false => NEAR_RING_MAX_BYTES,
    };
    let (ring_max, ring_stores) = match (topo.oversubscribed, placement) {
        (false, Placement::Near) => (near_max, Stores::Plain),
        (false, Placement::Apart) => (APART_RING_MAX_BYTES, Stores::Streaming),
        _ => (0, Stores::Plain),
    };
    Messages {
        single_copy,
        ring_max,
        // Its only other work is an in-place call's nothing, or a local
        // copy of an output large enough to be better done after the sends.
        sender_idle: !sched.receives
            && (!sched.local_work || call.in_place || call.out_bytes >= IDLE_COPY_MIN_BYTES),
        receives: sched.receives,
        ring_stores,
        recv_stores: Stores::Plain,
        copy_stores: Stores::Plain,
    }
}

#[cfg(test)]
mod tests;
