//! Errors at the C boundary: the one mapping from the core's error types to
//! `ncclResult_t` ([`map_error`]), the per-thread last-error text behind
//! `ncclGetLastError`, and `ncclGetErrorString`.
//!
//! Errors the FFI layer finds itself (NULL pointers, bad enum values, dead
//! handles, unimplemented functions) are built as core [`Error`] values too
//! (`InvalidArgument` / `InvalidUsage`), so every code comes from
//! [`map_error`].

use crate::last_error::last_error_ptr;
pub(crate) use crate::last_error::{last_error_text, set_last_error};
use crate::panic::nccl_api;
use crate::types::{ncclComm_t, ncclResult_t};
use nccl_net::NetError;
use nccl_rs::error::BootstrapError;
use nccl_rs::Error;
use std::ffi::c_char;
use std::io::ErrorKind;

/// The `ncclResult_t` for a core error. The one place this mapping lives.
///
/// * `InvalidArgument` → `ncclInvalidArgument`
/// * `InvalidUsage`, `Poisoned` → `ncclInvalidUsage`
/// * `Timeout` → `ncclTimeout`
/// * `System` → `ncclSystemError`, or `ncclUnhandledCudaError` when a CUDA
///   driver call failed (`cuda` feature)
/// * `Internal` → `ncclInternalError`
/// * `Remote` (another rank failed or died, reported through the
///   bootstrap's health channel) → `ncclRemoteError`
/// * `Aborted` → `ncclInvalidUsage`: the application aborted this
///   communicator, so using it further is a usage error. (Its peers see
///   their connections close: `ncclRemoteError`, as with NCCL.)
/// * `Transport`: a peer gone or the network failing (closed, reset,
///   refused, protocol garbage) → `ncclRemoteError`; a local socket call
///   failing otherwise → `ncclSystemError`; tag or size mismatches (ranks
///   calling different collectives) → `ncclInvalidUsage`; an undecodable
///   handle → `ncclInternalError`.
/// * `Bootstrap`: the root or a peer gone → `ncclRemoteError`; other socket
///   errors → `ncclSystemError`; its deadline → `ncclTimeout`; a bad unique
///   id → `ncclInvalidArgument`; rejected by the root (wrong size, duplicate
///   rank) → `ncclInvalidUsage`.
pub fn map_error(e: &Error) -> ncclResult_t {
    match e {
        Error::InvalidArgument(_) => ncclResult_t::InvalidArgument,
        Error::InvalidUsage(_) | Error::Poisoned { .. } | Error::Aborted { .. } => {
            ncclResult_t::InvalidUsage
        }
        Error::Timeout { .. } => ncclResult_t::Timeout,
        #[cfg(feature = "cuda")]
        Error::System { .. } if nccl_rs::cuda::CudaError::of(e).is_some() => {
            ncclResult_t::UnhandledCudaError
        }
        Error::System { .. } => ncclResult_t::SystemError,
        Error::Internal { .. } => ncclResult_t::InternalError,
        Error::Remote { .. } => ncclResult_t::RemoteError,
        Error::Transport { source, .. } => match source {
            NetError::Io { source, .. } if peer_gone(source.kind()) => ncclResult_t::RemoteError,
            NetError::Io { .. } => ncclResult_t::SystemError,
            NetError::TagMismatch { .. } | NetError::Truncated { .. } => ncclResult_t::InvalidUsage,
            NetError::BadHandle(_) => ncclResult_t::InternalError,
            _ => ncclResult_t::RemoteError,
        },
        Error::Bootstrap { source, .. } => match source {
            BootstrapError::Io { source, .. } if peer_gone(source.kind()) => {
                ncclResult_t::RemoteError
            }
            BootstrapError::Io { .. } => ncclResult_t::SystemError,
            BootstrapError::Timeout { .. } => ncclResult_t::Timeout,
            BootstrapError::BadId(_) => ncclResult_t::InvalidArgument,
            BootstrapError::Rejected(_) => ncclResult_t::InvalidUsage,
            _ => ncclResult_t::RemoteError,
        },
        _ => ncclResult_t::InternalError,
    }
}

fn peer_gone(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
            | ErrorKind::NotConnected
    )
}

/// A failure ready for C: its code and its full message.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub(crate) code: ncclResult_t,
    pub(crate) msg: String,
}

impl From<&Error> for Failure {
    fn from(e: &Error) -> Self {
        Failure {
            code: map_error(e),
            msg: e.to_string(),
        }
    }
}

/// The result of the FFI layer's internal functions.
pub(crate) type FfiResult<T> = Result<T, Error>;

/// `Error::InvalidArgument(msg)`.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// `Error::InvalidUsage(msg)`.
pub(crate) fn usage(msg: impl Into<String>) -> Error {
    Error::InvalidUsage(msg.into())
}

/// Reports `f` to C: records its message and returns its code.
pub(crate) fn report(f: &Failure) -> ncclResult_t {
    set_last_error(&f.msg);
    f.code
}

/// Converts an internal result to the code C gets, recording the message
/// of a failure.
pub(crate) fn to_code(r: FfiResult<ncclResult_t>) -> ncclResult_t {
    match r {
        Ok(code) => code,
        Err(e) => report(&Failure::from(&e)),
    }
}

fn error_string(code: ncclResult_t) -> &'static std::ffi::CStr {
    match code {
        ncclResult_t::Success => c"no error",
        ncclResult_t::UnhandledCudaError => c"unhandled cuda error (this build uses no CUDA)",
        ncclResult_t::SystemError => {
            c"unhandled system error (run with NCCL_DEBUG=INFO for details)"
        }
        ncclResult_t::InternalError => {
            c"internal error - please report this issue to the nccl-rs developers"
        }
        ncclResult_t::InvalidArgument => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        ncclResult_t::InvalidUsage => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        ncclResult_t::RemoteError => c"remote process exited or there was a network error",
        ncclResult_t::InProgress => c"NCCL operation in progress",
        ncclResult_t::Timeout => c"operation timed out",
        _ => c"unknown result code",
    }
}

nccl_api! {
    /// A fixed text for a result code.
    fn ncclGetErrorString / pncclGetErrorString(result: ncclResult_t) -> *const c_char {
        error_string(result).as_ptr()
    }

    /// The calling thread's last error message ("" if none). `comm` is not
    /// used: `ncclCommGetAsyncError` copies a communicator's background
    /// error into the calling thread's message.
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        let _ = comm;
        last_error_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::time::Duration;

    #[test]
    fn every_core_error_maps_to_its_nccl_code() {
        let io_err = |k| io::Error::new(k, "x");
        let transport = |source| Error::Transport {
            rank: 0,
            peer: 1,
            op: "all_reduce #1".into(),
            source,
        };
        let boot = |source| Error::Bootstrap { rank: 0, source };
        let cases = [
            (
                Error::InvalidArgument("x".into()),
                ncclResult_t::InvalidArgument,
            ),
            (Error::InvalidUsage("x".into()), ncclResult_t::InvalidUsage),
            (
                Error::Poisoned {
                    rank: 0,
                    first: "x".into(),
                },
                ncclResult_t::InvalidUsage,
            ),
            (
                Error::Aborted {
                    rank: 0,
                    op: "x".into(),
                },
                ncclResult_t::InvalidUsage,
            ),
            (
                Error::Timeout {
                    rank: 0,
                    op: "x".into(),
                    after: Duration::ZERO,
                    waiting_for: "y".into(),
                },
                ncclResult_t::Timeout,
            ),
            (
                Error::System {
                    rank: 0,
                    what: "x".into(),
                    source: io_err(ErrorKind::OutOfMemory),
                },
                ncclResult_t::SystemError,
            ),
            (
                Error::Internal {
                    rank: 0,
                    msg: "x".into(),
                },
                ncclResult_t::InternalError,
            ),
            (
                Error::Remote {
                    rank: 0,
                    msg: "rank 1 died".into(),
                },
                ncclResult_t::RemoteError,
            ),
            (
                transport(NetError::Closed("peer".into())),
                ncclResult_t::RemoteError,
            ),
            (
                transport(NetError::Io {
                    call: "recv",
                    source: io_err(ErrorKind::ConnectionReset),
                }),
                ncclResult_t::RemoteError,
            ),
            (
                transport(NetError::Io {
                    call: "socket",
                    source: io_err(ErrorKind::PermissionDenied),
                }),
                ncclResult_t::SystemError,
            ),
            (
                transport(NetError::TagMismatch {
                    expected: 1,
                    got: 2,
                }),
                ncclResult_t::InvalidUsage,
            ),
            (
                transport(NetError::Truncated { posted: 1, got: 2 }),
                ncclResult_t::InvalidUsage,
            ),
            (
                transport(NetError::BadHandle("x".into())),
                ncclResult_t::InternalError,
            ),
            (
                boot(BootstrapError::Timeout {
                    what: "x".into(),
                    after: Duration::ZERO,
                }),
                ncclResult_t::Timeout,
            ),
            (
                boot(BootstrapError::BadId("x".into())),
                ncclResult_t::InvalidArgument,
            ),
            (
                boot(BootstrapError::Rejected("x".into())),
                ncclResult_t::InvalidUsage,
            ),
            (
                boot(BootstrapError::Protocol("x".into())),
                ncclResult_t::RemoteError,
            ),
            (
                boot(BootstrapError::Io {
                    what: "x".into(),
                    source: io_err(ErrorKind::UnexpectedEof),
                }),
                ncclResult_t::RemoteError,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(map_error(&e), code, "{e}");
        }
    }
}
