//! Finalize, destroy, abort, and the communicator queries.

use crate::error::{invalid, report, to_code, usage, FfiResult};
use crate::group::holds;
use crate::handle::{lookup, release};
use crate::panic::nccl_api;
use crate::types::{ncclComm_t, ncclResult_t};
use std::ffi::c_int;

/// The library's `NCCL_VERSION_CODE` (2.30.7), as `include/nccl.h`.
pub const NCCL_VERSION_CODE: c_int = 23007;

fn out_int(
    name: &str,
    out: *mut c_int,
    value: impl FnOnce() -> FfiResult<usize>,
) -> FfiResult<ncclResult_t> {
    if out.is_null() {
        return Err(invalid(format!("{name}: output pointer is NULL")));
    }
    let v = c_int::try_from(value()?)
        .map_err(|_| invalid(format!("{name}: value does not fit an int")))?;
    // SAFETY: `out` is non-NULL and points to an int (contract).
    unsafe { out.write(v) };
    Ok(ncclResult_t::Success)
}

fn finalize(comm: ncclComm_t) -> FfiResult<ncclResult_t> {
    let shared = lookup(comm)?;
    if holds(&shared) {
        return Err(usage(
            "ncclCommFinalize: this thread's open group has calls on comm; end the group first",
        ));
    }
    let res = shared.wait_idle();
    shared.mark_finalized();
    Ok(match res {
        Ok(()) => ncclResult_t::Success,
        Err(f) => report(&f),
    })
}

fn destroy(comm: ncclComm_t, abort: bool) -> FfiResult<ncclResult_t> {
    let shared = lookup(comm)?;
    if holds(&shared) {
        return Err(usage(
            "this thread's open group has calls on comm; end the group first",
        ));
    }
    // NCCL lets one thread at a time operate a communicator; destroying it
    // under another thread's call would wait for that call's timeout.
    if !abort && shared.threads_in_calls() > 0 {
        return Err(usage(
            "ncclCommDestroy: another thread is inside a call on this communicator \
             (NCCL allows one thread at a time on a communicator); let it return first, \
             or call ncclCommAbort to stop it",
        ));
    }
    let shared = release(comm)?;
    if abort {
        shared.abort();
    }
    shared.close();
    Ok(ncclResult_t::Success)
}

fn async_error(comm: ncclComm_t, out: *mut ncclResult_t) -> FfiResult<ncclResult_t> {
    let shared = lookup(comm)?;
    if out.is_null() {
        return Err(invalid("ncclCommGetAsyncError: asyncError is NULL"));
    }
    let state = match shared.async_state() {
        None => ncclResult_t::InProgress,
        Some(Ok(())) => ncclResult_t::Success,
        Some(Err(f)) => report(&f),
    };
    // SAFETY: `out` is non-NULL and points to an ncclResult_t (contract).
    unsafe { out.write(state) };
    Ok(ncclResult_t::Success)
}

nccl_api! {
    /// Writes the library's version code.
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> ncclResult_t {
        to_code(out_int("ncclGetVersion", version, || Ok(NCCL_VERSION_CODE as usize)))
    }

    /// Waits for comm's operations; later operations are refused.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        to_code(finalize(comm))
    }

    /// Waits for comm's queued operations and frees it.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        to_code(destroy(comm, false))
    }

    /// Stops comm's operations and frees it.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        to_code(destroy(comm, true))
    }

    /// In progress, the first error, or success.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t {
        to_code(async_error(comm, asyncError))
    }

    /// The number of ranks.
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
        to_code(lookup(comm).and_then(|c| out_int("ncclCommCount", count, || Ok(c.ident()?.1))))
    }

    /// This rank.
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
        to_code(lookup(comm).and_then(|c| out_int("ncclCommUserRank", rank, || Ok(c.ident()?.0))))
    }

    /// The CUDA device the communicator stands for: the current device at
    /// init (`cuda` feature), `devlist[i]` for `ncclCommInitAll`.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
        to_code(lookup(comm).and_then(|c| out_int("ncclCommCuDevice", device, || Ok(c.device as usize))))
    }
}
