//! Whether a call's sends may go single-copy (the receiver copies straight
//! out of the sender's buffer: the shared-memory transport's cross-memory
//! attach, opt-in by `NCCL_SHM_USE_CMA=1`), passed to every connection
//! through [`SendComm::hint_single_copy`](crate::transport::SendComm::hint_single_copy).
//!
//! Measured on this 2-core machine, 2 ranks, with cross-memory attach on
//! for every message (`NCCL_SHM_USE_CMA=0|1 ncclrun -n 2 <tool> -b 64K -e 16M -f 4 -c 0`):
//! - reductions lose: the receiver reduces straight out of the ring instead
//!   of copying out first (all-reduce 16 MiB 6.7 → 12.4 ms with single copy);
//! - a rank that only sends (a broadcast root) loses: it idles while the
//!   receiver does all the copying, where the ring splits it between them
//!   (in-place broadcast 16 MiB 1.7–1.9 → 3.0–3.8 ms);
//! - all-gather and all-to-all, where each rank receives as much as it
//!   sends, come out within noise of the ring.

use super::{Call, OpLabel};

/// Whether `call`'s sends may go single-copy.
pub(super) fn single_copy_allowed(call: &Call<'_>) -> bool {
    let reduces = match call.what {
        OpLabel::Coll { coll, .. } => coll.reduces(),
        OpLabel::Group { .. } => false,
        #[cfg(test)]
        OpLabel::Test => call.sched.steps.iter().any(|s| s.needs_slot()),
    };
    !reduces && call.sched.steps.iter().any(|s| s.recv_peer().is_some())
}
