//! Errors of the core library. Each names the rank, and where it applies the
//! peer and the operation, so that a log line alone says what went wrong.

use std::time::Duration;

/// The result type of the core library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the bootstrap (rendezvous at init, out-of-band all-gather).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// A socket call failed.
    #[error("bootstrap {what} failed: {source}")]
    Io {
        /// What was being done, e.g. "connect to root 10.0.0.1:1234".
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The deadline passed.
    #[error("bootstrap timed out after {after:?} while {what}")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long it waited.
        after: Duration,
    },
    /// A peer sent something that is not our protocol.
    #[error("bootstrap protocol error: {0}")]
    Protocol(String),
    /// The unique id or environment was unusable.
    #[error("bad unique id or rendezvous address: {0}")]
    BadId(String),
    /// The root rejected this rank (e.g. wrong world size or duplicate rank).
    #[error("rejected by the root: {0}")]
    Rejected(String),
}

/// Errors of the core library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A caller passed an argument that cannot work; nothing was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The calls were valid one by one but not together (e.g. mismatched
    /// collectives across ranks, use after an error).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// Rendezvous failed.
    #[error("rank {rank}: {source}")]
    Bootstrap {
        /// Our rank.
        rank: usize,
        /// What failed.
        #[source]
        source: BootstrapError,
    },
    /// A transport call failed while talking to `peer`.
    #[error("rank {rank}: {op} with peer rank {peer}: {source}")]
    Transport {
        /// Our rank.
        rank: usize,
        /// The peer rank.
        peer: usize,
        /// The operation, e.g. "all_reduce #12" or "connect".
        op: String,
        /// The transport's error.
        #[source]
        source: nccl_net::NetError,
    },
    /// A deadline passed.
    #[error("rank {rank}: {op} timed out after {after:?}; waiting for {waiting_for}")]
    Timeout {
        /// Our rank.
        rank: usize,
        /// The operation.
        op: String,
        /// How long it waited.
        after: Duration,
        /// What it was waiting for (peers, connections).
        waiting_for: String,
    },
    /// A system call outside a transport failed.
    #[error("rank {rank}: {what}: {source}")]
    System {
        /// Our rank.
        rank: usize,
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A broken invariant inside the library (a bug): please report it.
    #[error("rank {rank}: internal error: {msg}")]
    Internal {
        /// Our rank.
        rank: usize,
        /// What went wrong.
        msg: String,
    },
    /// Another rank failed or died; the message names it (and its address).
    #[error("rank {rank}: {msg}")]
    Remote {
        /// Our rank.
        rank: usize,
        /// What happened elsewhere.
        msg: String,
    },
    /// `abort()` was called while the operation ran.
    #[error("rank {rank}: {op} aborted")]
    Aborted {
        /// Our rank.
        rank: usize,
        /// The operation.
        op: String,
    },
    /// An earlier error left the communicator unusable.
    #[error("rank {rank}: communicator failed earlier ({first}); only drop it")]
    Poisoned {
        /// Our rank.
        rank: usize,
        /// The first error, as text.
        first: String,
    },
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}
