//! `ncclComm_t` handles: opaque pointers to boxed Rust structs, checked on
//! every entry.
//!
//! A handle is `Box::into_raw` of a [`Handle`]. Every live handle is also a
//! key of a process-wide registry that maps it to its communicator. An entry
//! point looks the pointer up *before* touching it, so a NULL, stale
//! (destroyed or aborted) or foreign pointer is an `ncclInvalidArgument`
//! with a message, never a dereference. Only destroy and abort, after taking
//! the pointer out of the registry, turn it back into its `Box`.
//!
//! The one case this cannot catch: after a destroy, the allocator may hand
//! the same address to a new communicator, and a stale copy of the old
//! pointer then names the new one. That is a use-after-free in the
//! application; here it is a wrong communicator, not memory corruption.

use crate::comm::CommShared;
use crate::error::{invalid, FfiResult};
use crate::types::{ncclComm, ncclComm_t};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Tells our boxes from anything else in debug checks.
const MAGIC: u64 = 0x6e63_636c_2d72_7321; // "nccl-rs!"

/// What an `ncclComm_t` points to.
struct Handle {
    magic: u64,
    shared: Arc<CommShared>,
}

fn registry() -> MutexGuard<'static, HashMap<usize, Arc<CommShared>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<usize, Arc<CommShared>>>> = OnceLock::new();
    REGISTRY
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Makes a new handle for `shared`.
pub(crate) fn new_handle(shared: Arc<CommShared>) -> ncclComm_t {
    let ptr = Box::into_raw(Box::new(Handle {
        magic: MAGIC,
        shared: shared.clone(),
    }))
    .cast::<ncclComm>();
    registry().insert(ptr as usize, shared);
    ptr
}

/// The communicator behind a live handle.
pub(crate) fn lookup(comm: ncclComm_t) -> FfiResult<Arc<CommShared>> {
    if comm.is_null() {
        return Err(invalid("comm is NULL"));
    }
    registry()
        .get(&(comm as usize))
        .cloned()
        .ok_or_else(|| dead(comm))
}

fn dead(comm: ncclComm_t) -> nccl_rs::Error {
    invalid(format!("comm {comm:?} is not a live communicator (destroyed, aborted, or never created by this library)"))
}

/// Ends a handle: removes it from the registry and frees its box. Returns
/// its communicator (for the caller to shut down).
pub(crate) fn release(comm: ncclComm_t) -> FfiResult<Arc<CommShared>> {
    if comm.is_null() {
        return Err(invalid("comm is NULL"));
    }
    let shared = registry()
        .remove(&(comm as usize))
        .ok_or_else(|| dead(comm))?;
    // SAFETY: the pointer was in the registry, so it came from
    // `Box::into_raw` in `new_handle` and has not been freed (removal from
    // the registry, just done under its lock, happens once).
    let boxed = unsafe { Box::from_raw(comm.cast::<Handle>()) };
    debug_assert_eq!(boxed.magic, MAGIC);
    debug_assert!(Arc::ptr_eq(&boxed.shared, &shared));
    Ok(shared)
}
