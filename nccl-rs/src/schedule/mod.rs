//! Pure schedules: `(collective, nranks, rank, count, chunking) -> steps`.
//!
//! This module does no I/O, reads no clock and has no `unsafe`. Each
//! algorithm is a function that lists, for one rank, the steps the engine
//! runs, in NCCL's vocabulary (`Send`, `RecvReduceSend`,
//! `RecvReduceCopySend`, `RecvCopySend`, `Recv`). Offsets and counts are in
//! elements.
//!
//! # Ordering contract
//! For every ordered pair of ranks (a, b), the sequence of messages a's
//! schedule sends to b equals, element for element, the sequence of receives
//! b's schedule posts from a. The engine relies on this: transports match
//! messages in order. [`check::check_matching`] verifies it and is run by the
//! tests for every algorithm at many world sizes.
#![forbid(unsafe_code)]

pub mod check;
mod direct;
mod halving_doubling;
mod hier;
mod p2p;
mod ring;
mod tree;
mod zero_copy;

pub use direct::{all_reduce_direct, reduce_scatter_direct};
pub use halving_doubling::{all_reduce_halving_doubling, core_size};
pub use hier::{
    all_gather_hier, all_gather_hier_traffic, all_reduce_hier, all_reduce_hier_traffic,
    all_reduce_tree_hier, all_reduce_tree_hier_traffic, broadcast_hier, broadcast_hier_traffic,
    reduce_scatter_hier, reduce_scatter_hier_traffic, Hosts, Traffic,
};
pub use p2p::{
    all_gather_direct, all_to_all, all_to_all_acked, all_to_all_in_place, all_to_all_paced,
    broadcast_direct, gather, p2p_group, round_trip, scatter, P2pOp,
};
pub use ring::{
    all_gather, all_gather_on, all_reduce, all_reduce_on, broadcast, broadcast_on, reduce,
    reduce_on, reduce_scatter, reduce_scatter_on, RingOrder,
};
pub use tree::{all_reduce_tree, btree, dtree, Tree};
pub use zero_copy::{check_zero_copy, zero_copy, ZcAt, ZcBuf, ZcColl, ZcStep};

/// Where a step reads or writes, as an element offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Loc {
    /// The caller's send buffer.
    In(usize),
    /// The caller's receive buffer.
    Out(usize),
    /// The engine's reusable scratch buffer (sized by [`Schedule::scratch`]).
    Scratch(usize),
    /// Buffer `.0` of a send/recv group, at offset `.1`.
    Group(usize, usize),
}

impl Loc {
    /// The same buffer, `by` elements further.
    // An offset within one buffer, not a sum of two places: no `ops::Add`.
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, by: usize) -> Loc {
        match self {
            Loc::In(o) => Loc::In(o + by),
            Loc::Out(o) => Loc::Out(o + by),
            Loc::Scratch(o) => Loc::Scratch(o + by),
            Loc::Group(b, o) => Loc::Group(b, o + by),
        }
    }
}

/// One step of one rank. Incoming data of the `Recv*Reduce*` steps lands in a
/// staging slot of the engine, never in user memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send `count` elements at `src` to `to`.
    Send {
        /// Destination rank.
        to: usize,
        /// Source.
        src: Loc,
        /// Elements.
        count: usize,
    },
    /// Receive `count` elements from `from` straight into `dst`.
    Recv {
        /// Source rank.
        from: usize,
        /// Destination.
        dst: Loc,
        /// Elements.
        count: usize,
    },
    /// Receive from `from`, compute `dst = src ⊕ incoming` (dividing by the
    /// world size if `finalize` and the op is an average), then send `dst` to
    /// `to` if given.
    RecvReduceCopySend {
        /// Source rank.
        from: usize,
        /// Rank to forward the result to.
        to: Option<usize>,
        /// Local operand.
        src: Loc,
        /// Result.
        dst: Loc,
        /// Elements.
        count: usize,
        /// Whether this produces the final value (apply `Avg`'s division).
        finalize: bool,
    },
    /// Receive from `from` straight into `dst`, then send `dst` to `to`.
    RecvCopySend {
        /// Source rank.
        from: usize,
        /// Rank to forward to.
        to: usize,
        /// Destination (and forwarded data).
        dst: Loc,
        /// Elements.
        count: usize,
    },
    /// Local reduction `dst = dst ⊕ src` (then the average's division if
    /// `finalize`).
    Reduce {
        /// Operand.
        src: Loc,
        /// Accumulator and result.
        dst: Loc,
        /// Elements.
        count: usize,
        /// Whether this produces the final value.
        finalize: bool,
    },
    /// Copy `count` elements locally.
    Copy {
        /// Source.
        src: Loc,
        /// Destination.
        dst: Loc,
        /// Elements.
        count: usize,
    },
}

impl Step {
    /// The rank this step receives from, if any.
    pub fn recv_peer(&self) -> Option<usize> {
        match *self {
            Step::Recv { from, .. }
            | Step::RecvReduceCopySend { from, .. }
            | Step::RecvCopySend { from, .. } => Some(from),
            Step::Send { .. } | Step::Copy { .. } | Step::Reduce { .. } => None,
        }
    }

    /// The rank this step sends to, if any.
    pub fn send_peer(&self) -> Option<usize> {
        match *self {
            Step::Send { to, .. } | Step::RecvCopySend { to, .. } => Some(to),
            Step::RecvReduceCopySend { to, .. } => to,
            Step::Recv { .. } | Step::Copy { .. } | Step::Reduce { .. } => None,
        }
    }

    /// Elements moved by the step.
    pub fn count(&self) -> usize {
        match *self {
            Step::Send { count, .. }
            | Step::Recv { count, .. }
            | Step::RecvReduceCopySend { count, .. }
            | Step::RecvCopySend { count, .. }
            | Step::Copy { count, .. }
            | Step::Reduce { count, .. } => count,
        }
    }

    /// Whether the incoming data needs a staging slot (it is reduced, not
    /// stored).
    pub fn needs_slot(&self) -> bool {
        matches!(self, Step::RecvReduceCopySend { .. })
    }
}

/// The steps of one rank for one operation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Steps in execution order.
    pub steps: Vec<Step>,
    /// Elements of scratch space the steps use.
    pub scratch: usize,
}

/// Start of part `i` when `count` elements are split into `parts` nearly
/// equal parts (the first `count % parts` parts are one element longer).
pub fn part_start(count: usize, parts: usize, i: usize) -> usize {
    let (q, r) = (count / parts, count % parts);
    i * q + i.min(r)
}

/// Length of part `i`; see [`part_start`].
pub fn part_len(count: usize, parts: usize, i: usize) -> usize {
    part_start(count, parts, i + 1) - part_start(count, parts, i)
}

#[cfg(test)]
mod tests;
