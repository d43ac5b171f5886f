//! nccl-rs errors as Python exceptions. The classes are defined in
//! `nccl_rs/_errors.py` (so that they can also derive from Python's own
//! `TimeoutError` and `ValueError`); the message is the library's, which
//! names the rank and the operation.

use nccl_rs::error::BootstrapError;
use nccl_rs::Error;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception class of an error (a name in `nccl_rs._errors`).
pub(crate) fn class_of(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument(_) => "NcclInvalidArgumentError",
        Error::InvalidUsage(_) | Error::Poisoned { .. } => "NcclInvalidUsageError",
        Error::Timeout { .. }
        | Error::Bootstrap {
            source: BootstrapError::Timeout { .. },
            ..
        } => "NcclTimeoutError",
        Error::Bootstrap { .. } => "NcclBootstrapError",
        Error::Transport { .. } | Error::Remote { .. } => "NcclRemoteError",
        Error::System { .. } | Error::Internal { .. } => "NcclInternalError",
        Error::Aborted { .. } => "NcclAbortedError",
        _ => "NcclError",
    }
}

/// A Python exception of class `name` with `msg`.
pub(crate) fn raise(name: &str, msg: String) -> PyErr {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    Python::attach(|py| {
        let class = MODULE
            .get_or_try_init(py, || py.import("nccl_rs._errors").map(Bound::unbind))
            .and_then(|m| m.bind(py).getattr(name))
            .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
        match class {
            Ok(c) => PyErr::from_type(c, msg),
            Err(e) => e,
        }
    })
}

/// The exception for a library error.
pub(crate) fn to_py(e: Error) -> PyErr {
    raise(class_of(&e), e.to_string())
}

/// An invalid-argument exception (a `ValueError`) for a bad call from Python.
pub(crate) fn invalid(msg: String) -> PyErr {
    raise("NcclInvalidArgumentError", msg)
}
