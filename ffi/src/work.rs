//! What a call on a communicator becomes: a [`Work`] item, queued, batched
//! and run by `comm.rs` (on the calling thread, a scoped thread, or the
//! proxy thread of `worker.rs`, gated by `gate.rs`).
//!
//! # Layering
//! The modules of this crate form layers; each imports only from the
//! layers below it, so their imports have no cycle:
//! 1. `types`, `logging`, `last_error`; then `panic`, then `error`.
//! 2. `redop` (reduction ops), `work` (this module), `config`.
//! 3. `device`, then `gate`, then `worker`: the machinery that runs work.
//!    They see a communicator only through the traits [`SplitChild`] and
//!    `gate::Proxied`.
//! 4. `comm`: a communicator's state; implements those traits.
//! 5. `handle`, `group`, then the API: `init`, `manage`, `coll`, `ops`,
//!    `mem`, `stubs`.
//!
//! This module is a leaf: it imports `redop` and `error` only.

use crate::error::FfiResult;
use crate::redop::OpChoice;
use nccl_rs::comm::raw::{RawColl, RawP2p};
use nccl_rs::{Communicator, Config, DataType, UniqueId};
use std::sync::Arc;

/// One collective call, with NCCL's argument meanings.
#[derive(Debug)]
pub(crate) struct CollWork {
    pub(crate) coll: RawColl,
    pub(crate) send: *const u8,
    pub(crate) recv: *mut u8,
    pub(crate) count: usize,
    pub(crate) dtype: DataType,
    pub(crate) op: OpChoice,
    pub(crate) root: usize,
    /// The `cudaStream_t` (as an address; 0 is the default stream).
    pub(crate) stream: usize,
}

/// One send or receive with its `cudaStream_t`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct P2pWork {
    pub(crate) op: RawP2p,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) stream: usize,
}

/// The communicator an `ncclCommSplit` creates (`comm::CommShared`), as
/// the split's [`Work`] uses it. A trait, so that this module names
/// nothing above it.
pub(crate) trait SplitChild: Send + Sync {
    /// The core configuration the new communicator is made with.
    fn core_config(&self) -> &Config;
    /// Installs the core the split made.
    fn install(&self, core: Communicator);
    /// Counts `n` of its calls (its creation) finished with `res`.
    fn finish(&self, n: usize, res: &FfiResult<()>);
}

/// One queued operation of a communicator.
pub(crate) enum Work {
    /// Join the job (`ncclCommInitRank*`).
    Init(UniqueId),
    /// A collective.
    Coll(CollWork),
    /// Sends and receives that run together (peer may be this rank).
    P2p(Vec<P2pWork>),
    /// `ncclCommSplit`; `child` is the new handle's state (`None` for
    /// `NCCL_SPLIT_NOCOLOR`).
    Split {
        color: Option<u32>,
        key: i32,
        child: Option<Arc<dyn SplitChild>>,
    },
}

// SAFETY: the raw pointers in a `Work` are buffers the application lent for
// the call (and PreMulSum scalars). The C contract keeps them valid and
// untouched until the call completes — when the blocking call or
// `ncclGroupEnd` returns, or `ncclCommGetAsyncError` reports completion —
// and exactly one thread runs a given `Work`, so moving it to that thread
// is sound.
unsafe impl Send for Work {}

/// Bytes of (sendbuff, recvbuff) this rank uses, by NCCL's definitions.
pub(crate) fn sizes(
    coll: RawColl,
    rank: usize,
    n: usize,
    root: usize,
    count: usize,
    elem: usize,
) -> Option<(usize, usize)> {
    let b = count.checked_mul(elem)?;
    let nb = b.checked_mul(n)?;
    let at_root = |x| if rank == root { x } else { 0 };
    Some(match coll {
        RawColl::AllReduce => (b, b),
        RawColl::Broadcast => (at_root(b), b),
        RawColl::Reduce => (b, at_root(b)),
        RawColl::AllGather => (b, nb),
        RawColl::ReduceScatter => (nb, b),
        RawColl::AllToAll => (nb, nb),
        RawColl::Gather => (b, at_root(nb)),
        RawColl::Scatter => (at_root(nb), b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_nccl_counts() {
        assert_eq!(sizes(RawColl::AllGather, 1, 4, 0, 3, 4), Some((12, 48)));
        assert_eq!(sizes(RawColl::ReduceScatter, 1, 4, 0, 3, 4), Some((48, 12)));
        assert_eq!(sizes(RawColl::Reduce, 1, 4, 0, 3, 4), Some((12, 0)));
        assert_eq!(sizes(RawColl::Scatter, 0, 4, 0, 3, 2), Some((24, 6)));
        assert_eq!(sizes(RawColl::AllReduce, 0, 4, 0, usize::MAX, 2), None);
    }
}
