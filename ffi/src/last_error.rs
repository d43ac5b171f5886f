//! Each thread's last error message (`ncclGetLastError`, in `error.rs`).
//!
//! A leaf module of its own: both `error.rs` and the panic boundary
//! (`panic.rs`, which `error.rs` uses to export its functions) record
//! into it, and neither may import the other both ways.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Makes `msg` this thread's `ncclGetLastError` text and logs it.
pub(crate) fn set_last_error(msg: &str) {
    tracing::warn!("{msg}");
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error message.
pub(crate) fn last_error_text() -> String {
    LAST_ERROR.with(|l| l.borrow().to_string_lossy().into_owned())
}

/// This thread's last error message for C. The string lives in this
/// thread's slot until the next error on this thread replaces it, as the
/// header documents.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}
