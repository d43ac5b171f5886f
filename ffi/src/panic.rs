//! The panic boundary every exported function runs inside (after
//! rustls-ffi's `ffi_panic_boundary!`): a panic must never unwind into C.
//! It is caught, its message becomes the thread's last error, and the
//! function returns `ncclInternalError` (or its type's neutral value).

use crate::types::ncclResult_t;
use std::any::Any;
use std::ffi::c_char;

/// What an exported function returns when its body panicked.
pub(crate) trait PanicDefault {
    fn panic_value() -> Self;
}

impl PanicDefault for ncclResult_t {
    fn panic_value() -> Self {
        ncclResult_t::InternalError
    }
}

impl PanicDefault for *const c_char {
    fn panic_value() -> Self {
        c"internal error (a panic was caught at the API boundary)".as_ptr()
    }
}

impl PanicDefault for () {
    fn panic_value() -> Self {}
}

/// Records a caught panic as the last error and returns `T`'s panic value.
pub(crate) fn on_panic<T: PanicDefault>(payload: Box<dyn Any + Send>) -> T {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".into());
    crate::last_error::set_last_error(&format!(
        "internal error: panic in nccl-rs: {msg} (please report this bug)"
    ));
    T::panic_value()
}

/// Runs the body, turning a panic into the return type's panic value.
/// Also starts logging (`NCCL_DEBUG`) on the first call.
macro_rules! ffi_panic_boundary {
    ($($body:tt)*) => {{
        let run = ::std::panic::AssertUnwindSafe(|| {
            $crate::logging::init();
            $($body)*
        });
        match ::std::panic::catch_unwind(run) {
            Ok(value) => value,
            Err(payload) => $crate::panic::on_panic(payload),
        }
    }};
}

/// Defines an exported NCCL function and its `pnccl` profiling twin, with
/// the body inside [`ffi_panic_boundary!`]. Every function takes pointers
/// from C, so each is an `unsafe extern "C" fn` with one shared safety
/// contract: the header's.
macro_rules! nccl_api {
    ($(
        $(#[$attr:meta])*
        fn $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty $body:block
    )*) => {$(
        $(#[$attr])*
        ///
        /// # Safety
        /// Every pointer argument is NULL or valid as `include/nccl.h`
        /// documents for this function (buffers for the bytes the call
        /// reads or writes, until the call completes).
        #[no_mangle]
        #[allow(non_snake_case)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $crate::panic::ffi_panic_boundary! { $body }
        }

        #[doc = concat!("The profiling twin of [`", stringify!($name), "`]; same behaviour.")]
        ///
        /// # Safety
        #[doc = concat!("As for [`", stringify!($name), "`].")]
        #[no_mangle]
        #[allow(non_snake_case)]
        pub unsafe extern "C" fn $pname($($arg: $ty),*) -> $ret {
            // SAFETY: the same contract as the function it forwards to,
            // which the caller upholds.
            unsafe { $name($($arg),*) }
        }
    )*};
}

pub(crate) use ffi_panic_boundary;
pub(crate) use nccl_api;
