//! Errors of the verbs transport.
//!
//! [`VerbsError`] is this crate's typed error. Through the transport trait
//! it travels as [`NetError::Io`] whose source is an [`std::io::Error`]
//! wrapping the `VerbsError`, so callers can get the typed value back with
//! [`VerbsError::from_net`]; the message reads the same either way.

use nccl_net::NetError;
use std::io;

/// Status of a failed work completion (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

const WC_STATUS_NAMES: [&str; 24] = [
    "IBV_WC_SUCCESS",
    "IBV_WC_LOC_LEN_ERR",
    "IBV_WC_LOC_QP_OP_ERR",
    "IBV_WC_LOC_EEC_OP_ERR",
    "IBV_WC_LOC_PROT_ERR",
    "IBV_WC_WR_FLUSH_ERR",
    "IBV_WC_MW_BIND_ERR",
    "IBV_WC_BAD_RESP_ERR",
    "IBV_WC_LOC_ACCESS_ERR",
    "IBV_WC_REM_INV_REQ_ERR",
    "IBV_WC_REM_ACCESS_ERR",
    "IBV_WC_REM_OP_ERR",
    "IBV_WC_RETRY_EXC_ERR",
    "IBV_WC_RNR_RETRY_EXC_ERR",
    "IBV_WC_LOC_RDD_VIOL_ERR",
    "IBV_WC_REM_INV_RD_REQ_ERR",
    "IBV_WC_REM_ABORT_ERR",
    "IBV_WC_INV_EECN_ERR",
    "IBV_WC_INV_EEC_STATE_ERR",
    "IBV_WC_FATAL_ERR",
    "IBV_WC_RESP_TIMEOUT_ERR",
    "IBV_WC_GENERAL_ERR",
    "IBV_WC_TM_ERR",
    "IBV_WC_TM_RNDV_INCOMPLETE",
];

impl WcStatus {
    /// `IBV_WC_RETRY_EXC_ERR`: the peer did not acknowledge in time.
    pub const RETRY_EXC_ERR: WcStatus = WcStatus(12);
    /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP was already in error.
    pub const WR_FLUSH_ERR: WcStatus = WcStatus(5);

    /// The C enumerator's name, e.g. `"IBV_WC_RETRY_EXC_ERR"`.
    pub fn name(self) -> &'static str {
        WC_STATUS_NAMES
            .get(self.0 as usize)
            .copied()
            .unwrap_or("IBV_WC_<unknown>")
    }

    /// What usually causes this status, and what to look at.
    pub fn hint(self) -> &'static str {
        match self.0 {
            12 => "peer stopped answering (process gone, link down or fabric loss); see NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT",
            13 => "peer had no receive posted in time (receiver-not-ready retries exhausted)",
            5 => "flushed because the queue pair had already failed; see the first error on this connection",
            10 => "peer rejected the remote address or key (its buffer was deregistered or the access is out of range)",
            9 | 11 | 15 => "peer rejected the request (protocol or resource error on the remote side)",
            1 => "local length error (message larger than the posted buffer or the port's max_msg_sz)",
            4 | 8 => "local protection error (buffer not registered, deregistered, or registered in another protection domain)",
            2 => "local queue pair operation error (malformed work request)",
            7 => "unexpected response from the peer (mismatched queue pair setup: MTU, PSN or GID?)",
            19 | 21 => "the adapter reported a fatal error; check dmesg",
            _ => "see the libibverbs documentation of this status",
        }
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Everything that can go wrong in the verbs transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// libibverbs could not be loaded (`dlopen` failed): rdma-core is not
    /// installed. The caller falls back to TCP.
    #[error("NET/IB: cannot load {lib}: {reason}")]
    LibraryMissing {
        /// The soname tried.
        lib: String,
        /// `dlerror()`'s text.
        reason: String,
    },
    /// libibverbs lacks a function we need (library too old).
    #[error("NET/IB: libibverbs lacks {symbol}: {reason}")]
    MissingSymbol {
        /// The symbol.
        symbol: &'static str,
        /// `dlerror()`'s text.
        reason: String,
    },
    /// No active port passed the device filter.
    #[error("NET/IB: no usable RDMA port ({0})")]
    NoDevice(String),
    /// A setting is malformed.
    #[error("NET/IB: {var}={value:?} is not valid: expected {want}")]
    BadOption {
        /// Environment variable name.
        var: &'static str,
        /// The value given.
        value: String,
        /// What was expected.
        want: &'static str,
    },
    /// A verb returned an error.
    #[error("NET/IB: {call} failed on {device}: {source}")]
    Verb {
        /// The C function, e.g. `"ibv_create_qp"`.
        call: &'static str,
        /// Device (and port) name.
        device: String,
        /// errno as an I/O error.
        #[source]
        source: io::Error,
    },
    /// Moving a queue pair to the next state failed.
    #[error("NET/IB: ibv_modify_qp to {to} failed on {device} (peer {peer}): {source}")]
    ModifyQp {
        /// Target state, e.g. `"RTR"`.
        to: &'static str,
        /// Device name.
        device: String,
        /// Peer address.
        peer: String,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// A work completion reported an error.
    #[error(
        "NET/IB: {op} on {rail} (peer {peer}) completed with {status} (vendor error {vendor_err:#x}): {hint}"
    )]
    Completion {
        /// Peer address (of its side socket).
        peer: String,
        /// The connection rail and its local port, e.g. `"rail 1 (rxe1:1)"`.
        rail: String,
        /// What the work request did, e.g. `"RDMA write"`.
        op: &'static str,
        /// The verbs status.
        status: WcStatus,
        /// Provider-specific detail.
        vendor_err: u32,
        /// What to check.
        hint: &'static str,
    },
    /// The two ends cannot talk (e.g. InfiniBand against RoCE).
    #[error("NET/IB: incompatible peer {peer}: {why}")]
    Incompatible {
        /// Peer address.
        peer: String,
        /// What differs.
        why: String,
    },
}

impl VerbsError {
    /// The typed error inside a [`NetError`] produced by this crate, if any.
    pub fn from_net(e: &NetError) -> Option<&VerbsError> {
        match e {
            NetError::Io { source, .. } => source.get_ref()?.downcast_ref::<VerbsError>(),
            _ => None,
        }
    }

    /// A failed verb from the current `errno` (or `fallback` when the
    /// library left errno at 0).
    pub(crate) fn verb(call: &'static str, device: &str, rc: i32) -> VerbsError {
        let os = io::Error::last_os_error();
        let source = match (rc, os.raw_os_error()) {
            // Functions returning an errno value directly.
            (rc, _) if rc > 0 => io::Error::from_raw_os_error(rc),
            (_, Some(e)) if e != 0 => os,
            _ => io::Error::other("no errno set"),
        };
        VerbsError::Verb {
            call,
            device: device.to_owned(),
            source,
        }
    }

    fn call(&self) -> &'static str {
        match self {
            VerbsError::LibraryMissing { .. } | VerbsError::MissingSymbol { .. } => "dlopen",
            VerbsError::Verb { call, .. } => call,
            VerbsError::ModifyQp { .. } => "ibv_modify_qp",
            VerbsError::Completion { .. } => "work completion",
            _ => "ib",
        }
    }
}

impl From<VerbsError> for NetError {
    fn from(e: VerbsError) -> NetError {
        NetError::Io {
            call: e.call(),
            source: io::Error::other(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_and_hints() {
        assert_eq!(WcStatus::RETRY_EXC_ERR.name(), "IBV_WC_RETRY_EXC_ERR");
        assert_eq!(WcStatus(0).name(), "IBV_WC_SUCCESS");
        assert_eq!(WcStatus(23).name(), "IBV_WC_TM_RNDV_INCOMPLETE");
        assert_eq!(WcStatus(99).name(), "IBV_WC_<unknown>");
        assert!(WcStatus::RETRY_EXC_ERR.hint().contains("NCCL_IB_TIMEOUT"));
        assert!(WcStatus::RETRY_EXC_ERR.hint().contains("stopped answering"));
    }

    #[test]
    fn completion_error_names_peer_status_and_hint() {
        let e = VerbsError::Completion {
            peer: "10.0.2.15:4242".into(),
            rail: "rail 1 (mlx5_1:1)".into(),
            op: "RDMA write",
            status: WcStatus::RETRY_EXC_ERR,
            vendor_err: 0x81,
            hint: WcStatus::RETRY_EXC_ERR.hint(),
        };
        let net: NetError = e.into();
        let text = net.to_string();
        assert!(text.contains("10.0.2.15:4242"), "{text}");
        assert!(text.contains("RDMA write on rail 1 (mlx5_1:1)"), "{text}");
        assert!(text.contains("IBV_WC_RETRY_EXC_ERR"), "{text}");
        assert!(text.contains("NCCL_IB_RETRY_CNT"), "{text}");
        match VerbsError::from_net(&net) {
            Some(VerbsError::Completion { status, .. }) => {
                assert_eq!(*status, WcStatus::RETRY_EXC_ERR)
            }
            other => panic!("typed error lost: {other:?}"),
        }
    }
}
