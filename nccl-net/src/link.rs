//! Link counters: what the kernel or the adapter counts about a
//! connection's link (TCP retransmissions, verbs retries), sampled off the
//! hot path (at snapshot time) from any thread.

use std::fmt;
use std::sync::Arc;

/// Counters of one connection's link, since it was established.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Segments (TCP) or packets (verbs) the sender had to retransmit, as
    /// the kernel or adapter counts them for this connection's sockets or
    /// queue pairs (summed over rails and sockets).
    pub retransmits: u64,
}

impl LinkCounters {
    /// `self + other`, counter by counter (wrapping).
    pub fn plus(self, other: LinkCounters) -> LinkCounters {
        LinkCounters {
            retransmits: self.retransmits.wrapping_add(other.retransmits),
        }
    }
}

/// Reads a connection's [`LinkCounters`]. Shared with observers on other
/// threads (telemetry snapshots, the Prometheus writer, RAS), so it must
/// stay valid, and harmless, after its connection is dropped: a probe of a
/// closed connection reports what it last could, or zero.
pub trait LinkProbe: Send + Sync + fmt::Debug {
    /// The counters now. Makes a few short local system calls at most;
    /// never blocks on a peer.
    fn sample(&self) -> LinkCounters;
}

/// A shared probe, as the comms hand it out.
pub type SharedProbe = Arc<dyn LinkProbe>;
