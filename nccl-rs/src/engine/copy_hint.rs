//! Whether a call's sends may go single-copy (the receiver copies straight
//! out of the sender's buffer: the shared-memory transport's cross-memory
//! attach, `NCCL_SHM_USE_CMA`), passed to every connection through
//! [`SendComm::hint_single_copy`](crate::transport::SendComm::hint_single_copy).
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
//! So single copy goes to calls that do not reduce, of at most `max_bytes`
//! of buffers (`NCCL_SHM_CMA_MAX_BYTES`, 2 MiB), or a quarter of that
//! (512 KiB) on a rank that receives nothing. Each rank decides for its own
//! sends; the receiver takes either kind of message.

use super::{Call, CallBufs, OpLabel};

/// Whether `call`'s sends may go single-copy, given the bytes of its
/// buffers and the largest call allowed (`max_bytes`).
pub(super) fn single_copy_allowed(call: &Call<'_>, bufs: &CallBufs, max_bytes: usize) -> bool {
    let reduces = match call.what {
        OpLabel::Coll { coll, .. } => coll.reduces(),
        OpLabel::Group { .. } => false,
        #[cfg(test)]
        OpLabel::Test => call.sched.steps.iter().any(|s| s.needs_slot()),
    };
    let receives = call.sched.steps.iter().any(|s| s.recv_peer().is_some());
    let cap = if receives { max_bytes } else { max_bytes / 4 };
    let bytes = bufs.output.len + bufs.group.iter().map(|r| r.len).sum::<usize>();
    !reduces && bytes <= cap
}
