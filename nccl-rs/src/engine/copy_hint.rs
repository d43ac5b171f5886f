//! Whether a call's sends may go single-copy (the receiver copies straight
//! out of the sender's buffer: the shared-memory transport's cross-memory
//! attach, `NCCL_RS_SHM_SINGLE_COPY`), and whether this rank idles while they are
//! read, passed to every connection through
//! [`SendComm::hint_copy`](crate::transport::SendComm::hint_copy).
//!
//! Measured on this 2-core machine, 2 ranks, single copy on against off
//! (`ncclrun -n 2 <tool> -c 0`, interleaved runs; the per-op times of short
//! runs are noisy, so 64 KiB–1 MiB were taken with `-n 3000`–`5000`):
//! - reductions lose: the receiver reduces straight out of the ring instead
//!   of copying out first (all-reduce 16 MiB 6.7 → 12.4 ms with single copy);
//! - all-gather and all-to-all, where each rank receives as much as it
//!   sends, gain up to 2 MiB of output per rank and lose above: all-gather
//!   64 KiB 6.0–6.2 → 4.3–4.5 µs in place (7.8–8.0 → 7.3–8.6 out of place),
//!   1 MiB 104–108 → 70–82 µs, 2 MiB 210–223 → 195–205 µs, 4 MiB 416–427 →
//!   405–461 µs; all-to-all 64 KiB 9.4–9.9 → 7.5–8.5 µs, 1 MiB 126–127 →
//!   76–88 µs, 2 MiB 243–255 → 223–229 µs, 16 MiB 3.6–3.7 → 4.5–4.7 ms;
//! - a rank that only sends (a broadcast root) idles while the receiver does
//!   all the copying, where the ring splits it between two cores. With the
//!   ranks bound to CPUs (`ncclrun`), three interleaved runs of `-n 5000`,
//!   in place: 64 KiB 5.5–5.6 → 3.9–4.0 µs, 128 KiB 8.8–10.1 → 6.4 µs,
//!   512 KiB 33–38 → 20–21 µs, but 1 MiB 83–86 → 98–111 µs, 2 MiB 193–198 →
//!   240–283 µs, 16 MiB 1.5 → 2.2 ms.
//!
//! With more local ranks than CPUs (4 ranks bound in pairs to the 2 CPUs,
//! `ncclrun -n 4 <tool> -c 0`, single sizes, interleaved runs), all-gather
//! and broadcast relayed along the ring lose with single copy (64 KiB 12 →
//! 18–19 µs and 8–9 → 17–19 µs, 16 MiB 4.5 → 5.7 ms and 4.8–4.9 → 5.0–5.6
//! ms), while all-to-all gains: each byte is copied once instead of twice
//! by cores that are all busy.
//!
//! All-to-all gains most when each peer's block goes as one message rather
//! than in the engine's 512 KiB chunks ([`SingleCopyPolicy::whole_blocks`]):
//! single-copy messages take no ring space, and each costs a handshake with
//! a reader that may be descheduled. Single copy off → on, whole blocks,
//! two interleaved runs, out of place / in place:
//! - 2 ranks: 256 KiB 18–19 → 8 µs / 23–24 → 25 µs, 1 MiB 105–125 → 42 µs /
//!   129–130 → 107–113 µs, 4 MiB 481–483 → 331–332 µs / 791–802 →
//!   627–632 µs, 16 MiB 1.98–2.00 → 1.35 ms / 3.23 → 2.59–2.60 ms, 64 MiB
//!   11.6–11.7 → 10.3–11.3 ms / 19.6–20.7 → 20.0–20.1 ms (in chunks, single
//!   copy lost beyond 2 MiB: 16 MiB 3.6–3.7 → 4.5–4.7 ms);
//! - 4 ranks: 256 KiB 52–54 → 25–32 µs / 60 → 56–58 µs, 1 MiB 265–272 →
//!   181–184 µs / 336–340 → 302–311 µs, 4 MiB 1.09 → 0.72–0.73 ms /
//!   1.69–1.76 → 1.30–1.32 ms, 16 MiB 5.3–5.8 → 3.9–4.2 ms / 8.8–9.0 →
//!   7.1 ms, 64 MiB 28.5–28.7 → 24.5–24.6 ms / 44.0–44.7 → 46.0–46.5 ms
//!   (in chunks it gained only up to 4 MiB); at 64 KiB it is even out of
//!   place and loses in place (16–17 → 22–24 µs).
//!
//! All-gather moves as much as all-to-all, and gains the same way when it
//! runs in one hop, each rank's block to every other rank as one message
//! (`Planner::plan_direct_all_gather`, [`SingleCopyPolicy::whole_block_all_gather`]),
//! ring → one-hop single copy, two interleaved runs, out of place / in
//! place:
//! - 2 ranks (where the ring is one hop too): 4 MiB 427–433 → 371–395 µs /
//!   369–422 → 203–223 µs, 16 MiB 1.71–1.72 → 1.63–1.70 ms / 1.48–1.49 →
//!   1.05 ms, 64 MiB 9.8–9.9 → 9.6–9.7 ms / 7.1–7.6 → 6.1–6.8 ms;
//! - 4 ranks: 64 KiB 11.7–12.2 µs alike, 256 KiB 45 → 27 µs / 42–43 →
//!   24 µs, 1 MiB 212–214 → 144–156 µs / 185–189 → 113–114 µs, 4 MiB
//!   0.97–1.00 → 0.80 ms / 0.86–0.94 → 0.60–0.68 ms, 16 MiB 4.15–4.17 →
//!   3.11–3.34 ms / 3.66–3.68 → 2.84–2.97 ms, 64 MiB 25.2–25.3 → 19.3–20.7
//!   ms / 20.2–21.5 → 20.1–20.8 ms (one hop without single copy: 16 MiB
//!   4.9–5.6 ms).
//!
//! A broadcast root only sends: with the readers doing all the copying,
//! single copy loses in place beyond 1 MiB even in whole blocks (2 ranks,
//! 16 MiB 1.25–1.29 → 1.82–1.99 ms; 4 ranks one hop, 1 MiB 195–203 →
//! 245–250 µs, 16 MiB 3.6–3.7 → 4.1 ms). But an idle sender can copy part of
//! each message into its reader itself (`sender_idle`, the shared-memory
//! transport's split messages, `NCCL_SHM_CMA_SPLIT`): then two cores copy
//! once, where the ring copies twice. 2 ranks, in place, ring → single
//! copy with the root helping (`NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES=1G`, split on; two
//! interleaved runs): 256 KiB 9.2–9.3 → 6.7–7.0 µs, 1 MiB 48–53 → 20 µs,
//! 4 MiB 301–303 → 207–220 µs, 16 MiB 1.23–1.24 → 1.02–1.03 ms. So a 2-rank
//! broadcast goes single-copy at any size when every rank splits
//! ([`SingleCopyPolicy::split`]); at more ranks the root still helps its
//! reader where single copy is allowed.
//!
//! Helping pays only where the sender would idle: a rank that receives too
//! (all-gather, all-to-all) has its own copying to do (2 ranks, 256 KiB:
//! 7.8 → 9.4 µs with both helping), and so has an out-of-place broadcast
//! root with its local copy, up to IDLE_COPY_MIN_BYTES (64 KiB 3.3 →
//! 4.0–4.3 µs, 1 MiB 45 → 53 µs helping; 4 MiB 436 → 343 µs, 16 MiB 1.82 →
//! 1.43 ms, where the reader is the slower).
//!
//! From half the last-level cache of output on (`ring_from`,
//! `NCCL_SHM_STREAM_RING_BYTES`; 16 MiB on the development machine), a
//! 2-rank all-gather takes the ring again, in its chunks, now that the
//! receiver copies out with streaming stores ([`recv_hint`]):
//! `process_vm_readv` reads each destination line before it writes it, and
//! pins every page. Paired rounds (`scripts/paired.sh`, heap buffers, whole
//! blocks single copy → ring; Open MPI in the same rounds): 16 MiB 3.98 →
//! 3.07 ms (x1.30, ten rounds; 4.15), in place 2.64 → 1.89 ms (x1.38), 64
//! MiB 14.1 → 10.6 ms (x1.36, six rounds; 18.0); in place 64 MiB, two runs of
//! eight rounds, x0.94 and x1.35: faster by 1.2-1.8 while the two vCPUs
//! share a cache, slower by up to 1.6 while they do not (the ring's lines
//! cross between cores; `process_vm_readv` does not care), where the
//! out-of-place call still gained. Sending the chunks single copy instead
//! lost in place (x0.65, x0.75). The same all-gather in whole
//! blocks through the ring gained nothing (x0.95: each rank's own 8 MiB copy
//! runs with no transport progress), and all-to-all stays single copy:
//! through the ring in whole blocks it gained at 16 MiB (x1.16-1.22) but
//! lost at 64 MiB (x0.83), in chunks it tied (x1.02-1.12, x1.03), and an
//! in-place one, sending from shared staging memory, lost in chunks (2.38 →
//! 3.34 ms); with more local ranks than CPUs the ring tied too (4 ranks,
//! all-to-all 64 MiB x0.96-1.01).
//!
//! Sender and receiver must cut messages alike, so whole blocks need every
//! rank on one host with the same policy, which the ranks agree on at init
//! (`uniform`); otherwise all-to-all goes single-copy in chunks within the
//! windows where that gained (up to `max_bytes`, or 64 KiB–2 × `max_bytes`
//! with more local ranks than CPUs).
//!
//! A send/recv group reads its single-copy messages with `memcpy` from a
//! mapping when its send buffers are shared (`ncclMemAlloc`; the
//! shared-memory transport's mapped frames), and then single copy beats
//! the ring at every size: 2 ranks each sending to the other
//! (`sendrecv_perf -R 1`), ring (the 2 MiB cap) → single copy
//! (`NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES=1G`), two interleaved runs: 4 MiB 1.11 →
//! 0.66–0.76 ms, 16 MiB 4.3–4.6 → 2.5–2.9 ms, 64 MiB 17.5–18.3 → 10.0–11.7
//! ms; from heap buffers (`process_vm_readv`) the same change ties (16 MiB
//! 4.6–4.8 → 4.3–5.3 ms, 64 MiB 18.3–18.7 → 16.5–17.2 ms). So such groups
//! go single-copy at any size.
//!
//! So single copy goes to calls that do not reduce, of at most `max_bytes`
//! of buffers (`NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES`, 2 MiB), or a quarter of that
//! (512 KiB) on a rank that receives nothing, or of any size for a send/recv
//! group sending from shared buffers; with more local ranks than CPUs, to
//! all-to-all only; and, when every rank is on this host, to
//! all-to-all and one-hop all-gather of any size (more than 64 KiB with
//! more local ranks than CPUs; all-gather one hop at 2 ranks or with more
//! local ranks than CPUs) in whole blocks (2-rank all-gather below
//! `ring_from`, or of any size while the two CPUs share no cache, which
//! rank 0 times before each such call: `comm::placement`; an out-of-place
//! 2-rank all-to-all from `ring_from` found near takes the ring). Each rank
//! decides for its own sends; the receiver takes either kind of message.

use super::{Call, CallBufs, OpLabel, Region};
use crate::plan::Coll;
use crate::schedule::{Loc, Step};
use crate::transport::{CopyHint, RecvHint};

/// With more local ranks than CPUs, the smallest all-to-all (bytes of this
/// rank's buffers) that goes single-copy is one byte more than this.
pub(crate) const OVERSUBSCRIBED_MIN_BYTES: usize = 64 << 10;

/// An out-of-place call whose rank only sends and copies locally counts
/// as idle (helping its readers copy) from this many output bytes on.
pub(crate) const IDLE_COPY_MIN_BYTES: usize = 2 << 20;

/// With more local ranks than CPUs, the staging copy of an all-to-all's
/// input (`Core::stage_input`) and its own block's copy use streaming
/// stores from this many bytes of input (elsewhere from `ring_from`,
/// `NCCL_SHM_STREAM_RING_BYTES`, half the last-level cache): the
/// ranks sharing the cache each hold an input, a staging copy and an
/// output, and the readers take the staged blocks from memory anyway.
///
/// Out-of-place all-to-all is staged at every size that goes single copy
/// in whole blocks. 4 ranks on 2 cores (32 MiB L3), heap buffers, paired
/// rounds (`scripts/paired.sh`), staged against `process_vm_readv`: with
/// plain stores, 128 KiB 64.6 -> 45.9 us, 512 KiB 166 -> 106 us, 1 MiB 293
/// -> 182 us, but 2 MiB 785 -> 1047 us, 4 MiB 1.81 -> 2.11 ms (x0.84), 8
/// MiB x0.98; with streaming stores from 16 MiB (the cache rule), 16 MiB
/// x1.29 and x1.37, 32 MiB x1.30, 64 MiB x1.27. Streaming from 2 MiB, six
/// rounds each (medians of the per-round ratios; Open MPI in the same
/// rounds): 2 MiB 659 -> 452 us (x1.33; 811), 4 MiB 2.11 -> 1.76 ms
/// (x1.07; 2.11), 8 MiB 3.90 -> 3.16 ms (x1.18; 3.97), 16 MiB 7.28 -> 5.48
/// ms (x1.38; 7.70), 64 MiB 26.6 -> 17.5 ms (x1.49; 29.4); from 1 MiB it
/// lost at 1 MiB (x0.51). In place (staged already) streaming from 2 MiB
/// tied (4 MiB x0.99, 16 MiB x1.06), and so did streaming the staged
/// all-gather input (8, 16, 64 MiB of output: x0.96, x1.05, x0.97; not
/// done). Ranks on their own CPUs stage only from `ring_from` (see
/// [`SingleCopyPolicy::stages_all_to_all`]).
pub(crate) const OVERSUBSCRIBED_STAGE_STREAM_MIN_BYTES: usize = 2 << 20;

/// Largest out-of-place all-to-all (bytes of input) staged in shared
/// memory: the staging buffer stays allocated for the communicator's life
/// (grown in powers of two), so larger calls read the caller's buffer with
/// `process_vm_readv` instead of holding that much more memory per rank.
/// Staging was measured to gain up to 64 MiB.
pub(crate) const STAGED_ALL_TO_ALL_MAX_BYTES: usize = 256 << 20;

/// When a call's sends may go single-copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SingleCopyPolicy {
    /// Largest call (bytes of its buffers on this rank) allowed
    /// (`NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES`).
    pub(crate) max_bytes: usize,
    /// More ranks on this host than CPUs: only all-to-all (and one-hop
    /// all-gather when `uniform`), of more than [`OVERSUBSCRIBED_MIN_BYTES`]
    /// (all-to-all at most `2 * max_bytes` unless `uniform`).
    pub(crate) oversubscribed: bool,
    /// Every rank is on this host with single copy on and this same policy
    /// (agreed at init): all-to-all then goes single-copy at any size, in
    /// whole blocks, and so does all-gather between two ranks.
    pub(crate) uniform: bool,
    /// The communicator has two ranks (all-gather is then one hop).
    pub(crate) pair: bool,
    /// Idle senders help copy their single-copy messages
    /// (`NCCL_SHM_CMA_SPLIT`): with `uniform` and `pair`, broadcast goes
    /// single-copy at any size.
    pub(crate) split: bool,
    /// All-gather between two ranks with at least this many bytes of
    /// output takes the ring in chunks (see [`SingleCopyPolicy::rings`]),
    /// whose receiver copies out with streaming stores ([`recv_hint`]),
    /// where `process_vm_readv` reads every destination line first
    /// (`NCCL_SHM_STREAM_RING_BYTES`; `usize::MAX`: never).
    pub(crate) ring_from: usize,
    /// Before a 2-rank all-gather of `ring_from` bytes or more, the ranks
    /// time a round trip: this many nanoseconds or more say their CPUs do
    /// not share a cache (`NCCL_SHM_APART_NS`; 0: no probe; see
    /// [`SingleCopyPolicy::watches_placement`]).
    pub(crate) apart_ns: u64,
    /// Set per call, not agreed at init: where the two ranks' CPUs were
    /// found at the start of this call (`Core::probe_placement`; only before
    /// calls [`SingleCopyPolicy::watches_placement`] names).
    pub(crate) placement: Placement,
}

/// Whether two ranks' CPUs share a cache, as timed before a call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Not timed for this call.
    #[default]
    Unknown,
    /// They share one: the ring in chunks, two copies through the cache,
    /// beats single copy, for out-of-place all-to-all too.
    Near,
    /// They do not: every ring line crosses between the caches. All-to-all
    /// goes single copy in whole blocks; the rings of all-gather and
    /// all-reduce are written with streaming stores
    /// (`CopyHint::receiver_apart`).
    Apart,
}

impl SingleCopyPolicy {
    /// Whether an all-to-all with `bytes` of buffers on this rank may go
    /// single-copy.
    pub(crate) fn all_to_all(&self, bytes: usize) -> bool {
        if self.placement == Placement::Near {
            // Timed near (out of place, 2 ranks, from `ring_from`): the ring.
            return false;
        }
        let max = self.max_bytes;
        match (self.uniform, self.oversubscribed) {
            (true, true) => OVERSUBSCRIBED_MIN_BYTES < bytes,
            (true, false) => true,
            (false, true) => OVERSUBSCRIBED_MIN_BYTES < bytes && bytes <= max.saturating_mul(2),
            (false, false) => bytes <= max,
        }
    }

    /// Whether such an all-to-all sends each peer's block as one message
    /// instead of in the engine's chunks (see `Core::collective`): a
    /// single-copy message takes no ring space, and every chunk costs a
    /// handshake with a reader that may not be running. Only when
    /// `uniform`, since sender and receiver must cut messages alike.
    pub(crate) fn whole_blocks(&self, bytes: usize) -> bool {
        self.uniform && self.all_to_all(bytes)
    }

    /// Whether an out-of-place all-to-all with `bytes` of input on this
    /// rank, read single copy in whole blocks, sends from a copy of its
    /// input in shared memory (`Core::stage_input`; the readers then
    /// `memcpy` from a mapping instead of `process_vm_readv`): with more
    /// local ranks than CPUs at every such size, otherwise from `ring_from`
    /// bytes (`NCCL_SHM_STREAM_RING_BYTES`, by default half the last-level
    /// cache, 16 MiB here), where the copy streams; never above
    /// [`STAGED_ALL_TO_ALL_MAX_BYTES`]. 2 ranks on 2 cores, heap buffers,
    /// paired rounds (`scripts/paired.sh`), staged against
    /// `process_vm_readv`: 16 MiB 3.21 -> 2.55 ms (x1.26, six rounds) and
    /// 2.85 -> 2.39 ms (x1.20, eight), 32 MiB 6.56 -> 5.64 ms (x1.12), 64
    /// MiB 11.7 -> 9.90 ms (x1.20; Open MPI 3.26, 3.47, 7.33 and 13.9 ms in
    /// the same rounds). Below it, with plain stores, it lost (4 MiB 303 ->
    /// 974 us, 8 MiB 1.39 -> 2.11 ms: buffers that stay in the cache, read in
    /// place by `process_vm_readv`), and an earlier host measured a loss at
    /// 16 MiB too (3.41 -> 3.77 ms). With more local ranks than CPUs see
    /// [`OVERSUBSCRIBED_STAGE_STREAM_MIN_BYTES`].
    pub(crate) fn stages_all_to_all(&self, bytes: usize) -> bool {
        (self.oversubscribed || bytes >= self.ring_from)
            && bytes <= STAGED_ALL_TO_ALL_MAX_BYTES
            && self.whole_blocks(bytes)
    }

    /// Whether an all-to-all's copy of `bytes` of input into staging (and of
    /// its own block into the output) uses streaming stores: from
    /// [`OVERSUBSCRIBED_STAGE_STREAM_MIN_BYTES`] with more local ranks than
    /// CPUs, otherwise from `ring_from`.
    pub(crate) fn stage_streams(&self, bytes: usize) -> bool {
        match self.oversubscribed {
            true => bytes >= OVERSUBSCRIBED_STAGE_STREAM_MIN_BYTES,
            false => bytes >= self.ring_from,
        }
    }

    /// Whether a 2-rank all-gather with `bytes` of output takes the ring in
    /// chunks rather than single copy in whole blocks: from
    /// [`SingleCopyPolicy::ring_from`] on, not with more local ranks than
    /// CPUs. Wherever the CPUs are: apart, the ring is written with
    /// streaming stores ([`Placement::Apart`]), which beat single copy
    /// (see `comm::placement`).
    pub(crate) fn rings(&self, bytes: usize) -> bool {
        !self.oversubscribed && bytes >= self.ring_from
    }

    /// Whether a 2-rank all-gather or all-to-all with `bytes` of output
    /// would take the ring in chunks while the CPUs share a cache (an
    /// all-to-all only if out of place on both ranks, which the probe
    /// trades), or an all-reduce would stream its ring writes while they
    /// do not, and so is worth a look at where they are
    /// (`Core::probe_placement`): every rank on this host, which the ranks
    /// agreed on, so they all ask.
    pub(crate) fn watches_placement(&self, bytes: usize) -> bool {
        self.uniform
            && self.pair
            && self.apart_ns != 0
            && !self.oversubscribed
            && bytes >= self.ring_from
    }

    /// Whether a broadcast goes single-copy at any size: two ranks on one
    /// host, not oversubscribed, whose root helps its reader copy.
    pub(crate) fn split_broadcast(&self) -> bool {
        self.uniform && self.pair && self.split && !self.oversubscribed
    }

    /// Whether an all-gather with `bytes` of output on this rank goes
    /// single-copy, one hop, each rank's block as one message: on one host,
    /// between two ranks, or above [`OVERSUBSCRIBED_MIN_BYTES`] with more
    /// local ranks than CPUs.
    /// Between two ranks, not from [`SingleCopyPolicy::ring_from`] on.
    pub(crate) fn whole_block_all_gather(&self, bytes: usize) -> bool {
        let fits = match self.oversubscribed {
            true => OVERSUBSCRIBED_MIN_BYTES < bytes,
            false => self.pair && !self.rings(bytes),
        };
        self.uniform && fits
    }
}

impl Default for SingleCopyPolicy {
    fn default() -> Self {
        SingleCopyPolicy {
            max_bytes: usize::MAX,
            oversubscribed: false,
            uniform: false,
            pair: false,
            split: false,
            ring_from: usize::MAX,
            apart_ns: 0,
            placement: Placement::Unknown,
        }
    }
}

/// Whether every send of `call` reads a caller's buffer that lies in one
/// shared allocation (`ncclMemAlloc`, [`crate::ShmBuffer`]), and there is
/// one: a reader on this host maps such a buffer and copies with `memcpy`
/// instead of `process_vm_readv` (the shared-memory transport's mapped
/// frames).
fn sends_mapped(call: &Call<'_>, bufs: &CallBufs) -> bool {
    let shared = |r: &Region| r.len > 0 && crate::hostmem::locate(r.ptr, r.len).is_some();
    let (mut input, mut output) = (None, None);
    let mut any = false;
    for step in &call.sched.steps {
        let Step::Send { src, .. } = *step else {
            continue;
        };
        any = true;
        let ok = match src {
            Loc::In(_) => *input.get_or_insert_with(|| shared(&bufs.input)),
            Loc::Out(_) => *output.get_or_insert_with(|| shared(&bufs.output)),
            Loc::Group(b, _) => bufs.group.get(b).is_some_and(shared),
            Loc::Scratch(_) => false,
        };
        if !ok {
            return false;
        }
    }
    any
}

/// Whether `sched` sends at most one message to each peer and forwards
/// nothing it received.
fn one_message_per_peer(sched: &crate::schedule::Schedule) -> bool {
    let mut peers: Vec<usize> = Vec::new();
    for step in &sched.steps {
        match step {
            crate::schedule::Step::Send { to, .. } if !peers.contains(to) => peers.push(*to),
            s if s.send_peer().is_some() => return false,
            _ => {}
        }
    }
    true
}

/// The hint for `call`'s sends under `policy`.
pub(super) fn copy_hint(call: &Call<'_>, bufs: &CallBufs, policy: SingleCopyPolicy) -> CopyHint {
    let receives = call.sched.steps.iter().any(|s| s.recv_peer().is_some());
    CopyHint {
        single_copy: single_copy_allowed(call, bufs, policy, receives),
        sender_idle: !receives && sender_idle(call, bufs),
        receives,
        receiver_apart: policy.placement == Placement::Apart,
    }
}

/// Whether this rank, which receives nothing, only waits while its sends
/// are read: it copies nothing locally (in place, the root's copy is to
/// itself) or at least [`IDLE_COPY_MIN_BYTES`] (its memcpy then finishes
/// before the reader's cross-process copy).
fn sender_idle(call: &Call<'_>, bufs: &CallBufs) -> bool {
    let local_work = call
        .sched
        .steps
        .iter()
        .any(|s| !matches!(s, Step::Send { .. }));
    !local_work || bufs.input.ptr == bufs.output.ptr || bufs.output.len >= IDLE_COPY_MIN_BYTES
}

/// Whether `call`'s sends may go single-copy under `policy`, given the
/// bytes of its buffers; `receives`: whether the call receives anything.
fn single_copy_allowed(
    call: &Call<'_>,
    bufs: &CallBufs,
    policy: SingleCopyPolicy,
    receives: bool,
) -> bool {
    let coll = match call.what {
        OpLabel::Coll { coll, .. } => Some(coll),
        _ => None,
    };
    let bytes = bufs.output.len + bufs.group.iter().map(|r| r.len).sum::<usize>();
    match coll {
        Some(Coll::AllToAll { .. }) => return policy.all_to_all(bytes),
        // Only in the shape it was measured in: one message to each peer
        // (not the ring that `NCCL_ALGO` may keep).
        Some(Coll::AllGather { .. })
            if policy.whole_block_all_gather(bytes) && one_message_per_peer(call.sched) =>
        {
            return true
        }
        // The root copies half of each message into its reader.
        Some(Coll::Broadcast { .. }) if policy.split_broadcast() => return true,
        _ => {}
    }
    if policy.oversubscribed {
        return false;
    }
    let cap = if receives {
        policy.max_bytes
    } else {
        policy.max_bytes / 4
    };
    // A send/recv group whose sends all come from shared buffers is read by
    // `memcpy` from a mapping, which beats the ring at any size (see the
    // module docs); by `process_vm_readv` it only ties above the cap.
    let mapped = matches!(call.what, OpLabel::Group { .. }) && sends_mapped(call, bufs);
    !reduces(call) && (bytes <= cap || mapped)
}

/// Whether `call` reduces what it receives.
fn reduces(call: &Call<'_>) -> bool {
    match call.what {
        OpLabel::Coll { coll, .. } => coll.reduces(),
        OpLabel::Group { .. } => false,
        #[cfg(test)]
        OpLabel::Test => call.sched.steps.iter().any(|s| s.needs_slot()),
    }
}

/// The hint for `call`'s receives: copies into its output may stream when
/// the output has at least `stream_min` bytes (it will not stay in the
/// caches) and the call neither reduces nor forwards what it receives
/// (both read it again soon).
pub(super) fn recv_hint(call: &Call<'_>, bufs: &CallBufs, stream_min: usize) -> RecvHint {
    let out = &bufs.output;
    if out.len < stream_min {
        return RecvHint::default();
    }
    let forwards = call.sched.steps.iter().any(|s| {
        matches!(
            s,
            Step::RecvCopySend { .. } | Step::RecvReduceCopySend { to: Some(_), .. }
        )
    });
    if reduces(call) || forwards {
        return RecvHint::default();
    }
    let start = out.ptr as usize;
    RecvHint {
        stream: (start, start.saturating_add(out.len)),
    }
}

#[cfg(test)]
mod tests;
