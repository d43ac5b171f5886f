//! `ncclMemAlloc`/`ncclMemFree` (page-aligned shared host memory that
//! co-located ranks map to copy between their buffers directly, see
//! `nccl_rs::hostmem`; device memory with the `cuda` feature when a GPU is
//! usable) and
//! `ncclCommRegister`/`ncclCommDeregister` (host memory outside
//! `ncclMemAlloc` is moved onto transparent huge pages where the kernel
//! allows, which co-located peers read about twice as fast, see
//! `nccl_rs::hostmem::prefer_huge_pages`; device memory gets an INFO line
//! on its path through the communicator's network transport: DMA-BUF, peer
//! memory or staging, see `nccl_rs::cuda::netreg`).
//! Both keep a registry, so freeing a foreign pointer or a handle twice is
//! an error, not heap corruption.

use crate::comm::CommShared;
use crate::error::{invalid, to_code, FfiResult};
use crate::handle::lookup;
use crate::panic::nccl_api;
use crate::types::{ncclComm_t, ncclResult_t};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Device memory handed out by `ncclMemAlloc` (`cuda` feature, GPU
/// present).
fn device_allocations() -> MutexGuard<'static, std::collections::HashSet<usize>> {
    static ALLOCS: OnceLock<Mutex<std::collections::HashSet<usize>>> = OnceLock::new();
    ALLOCS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn mem_alloc(ptr: *mut *mut c_void, size: usize) -> FfiResult<ncclResult_t> {
    if ptr.is_null() {
        return Err(invalid("ncclMemAlloc: ptr is NULL"));
    }
    let p = if size == 0 {
        std::ptr::null_mut()
    } else if let Some(dev) = crate::device::mem_alloc(size) {
        let p = dev?;
        device_allocations().insert(p as usize);
        p
    } else {
        // Shared host memory: co-located ranks map it and copy between
        // their buffers directly (`nccl_rs::hostmem`); page-aligned.
        let p = nccl_rs::hostmem::alloc_raw(size).map_err(|e| nccl_rs::Error::System {
            rank: 0,
            what: format!("ncclMemAlloc of {size} bytes: {e}"),
            source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        })?;
        p.cast()
    };
    // SAFETY: `ptr` is non-NULL and points to a `void*` (contract).
    unsafe { ptr.write(p) };
    Ok(ncclResult_t::Success)
}

fn mem_free(ptr: *mut c_void) -> FfiResult<ncclResult_t> {
    if ptr.is_null() {
        return Ok(ncclResult_t::Success);
    }
    if device_allocations().remove(&(ptr as usize)) {
        // SAFETY: returned by ncclMemAlloc's device path and still
        // registered, so freed exactly once.
        unsafe { crate::device::mem_free(ptr) }?;
        return Ok(ncclResult_t::Success);
    }
    // SAFETY: `free_raw` frees only the start of a live allocation from
    // `alloc_raw` (each exactly once: it leaves the registry) and refuses
    // anything else.
    if !unsafe { nccl_rs::hostmem::free_raw(ptr.cast()) } {
        return Err(invalid(format!(
            "ncclMemFree: {ptr:?} was not returned by ncclMemAlloc (or was freed already)"
        )));
    }
    Ok(ncclResult_t::Success)
}

/// A registration: which communicator it belongs to (by identity).
struct Registration {
    comm: Arc<CommShared>,
    /// The host buffer registration moved onto huge pages, if any (its
    /// record is dropped again on deregistration).
    huge: Option<(usize, usize)>,
}

fn registrations() -> MutexGuard<'static, HashMap<usize, Registration>> {
    static REGS: OnceLock<Mutex<HashMap<usize, Registration>>> = OnceLock::new();
    REGS.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn register(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> FfiResult<ncclResult_t> {
    let comm = lookup(comm)?;
    if handle.is_null() {
        return Err(invalid("ncclCommRegister: handle is NULL"));
    }
    if buff.is_null() && size > 0 {
        return Err(invalid("ncclCommRegister: buff is NULL"));
    }
    note_net_path(&comm, buff, size);
    let huge = match is_host(buff) && huge_pages(buff.cast(), size) {
        true => Some((buff as usize, size)),
        false => None,
    };
    let token = Box::into_raw(Box::new(0u8));
    registrations().insert(token as usize, Registration { comm, huge });
    // SAFETY: `handle` is non-NULL and points to a `void*` (contract).
    unsafe { handle.write(token.cast()) };
    Ok(ncclResult_t::Success)
}

/// Whether `buff` is host memory.
#[cfg(feature = "cuda")]
fn is_host(buff: *const c_void) -> bool {
    nccl_rs::cuda::classify(buff) == nccl_rs::cuda::MemKind::Host
}

/// Without the `cuda` feature every buffer is host memory.
#[cfg(not(feature = "cuda"))]
fn is_host(_buff: *const c_void) -> bool {
    true
}

/// Moves a registered host buffer onto huge pages where the kernel allows,
/// and says (INFO) what came of it; whether the kernel took the advice.
fn huge_pages(buff: *const u8, size: usize) -> bool {
    use nccl_rs::hostmem::HugePages;
    let (what, errno, advised) = match nccl_rs::hostmem::prefer_huge_pages(buff, size) {
        HugePages::NotApplicable => return false,
        HugePages::Collapsed(bytes) => {
            tracing::info!(
                size,
                "ncclCommRegister: {} MiB of the buffer now on huge pages",
                bytes >> 20
            );
            return true;
        }
        HugePages::Advised(errno) => ("huge pages advised, not collapsed now", errno, true),
        HugePages::Refused(errno) => ("no huge pages for the buffer", errno, false),
    };
    tracing::info!(size, errno, "ncclCommRegister: {what}");
    advised
}

/// Logs (INFO) how device memory at `buff` would travel through the
/// communicator's network transport, probed against its `ptr_support`.
#[cfg(feature = "cuda")]
fn note_net_path(comm: &CommShared, buff: *const c_void, size: usize) {
    if nccl_rs::cuda::classify(buff) == nccl_rs::cuda::MemKind::Host {
        return;
    }
    let cfg = match nccl_rs::cuda::gdr::GdrConfig::from_env() {
        Ok(c) => c,
        Err(e) => return tracing::warn!("ncclCommRegister: {e}"),
    };
    match comm.net_properties() {
        Some(net) => drop(nccl_rs::cuda::netreg::decide(buff, size, &net, &cfg, None)),
        // Busy or not yet created: the transport-blind line.
        None => crate::device::note_registration(buff, size),
    }
}

/// Without the `cuda` feature every buffer is host memory.
#[cfg(not(feature = "cuda"))]
fn note_net_path(_comm: &CommShared, buff: *const c_void, size: usize) {
    crate::device::note_registration(buff, size);
}

fn deregister(comm: ncclComm_t, handle: *mut c_void) -> FfiResult<ncclResult_t> {
    let comm = lookup(comm)?;
    let mut regs = registrations();
    match regs.get(&(handle as usize)) {
        Some(r) if Arc::ptr_eq(&r.comm, &comm) => {}
        Some(_) => {
            return Err(invalid(
                "ncclCommDeregister: handle belongs to another communicator",
            ))
        }
        None => {
            return Err(invalid(format!(
                "ncclCommDeregister: {handle:?} is not a live registration handle"
            )))
        }
    }
    if let Some(Registration {
        huge: Some((buff, size)),
        ..
    }) = regs.remove(&(handle as usize))
    {
        nccl_rs::hostmem::forget_huge_pages(buff as *const u8, size);
    }
    // SAFETY: the token came from `Box::into_raw(Box<u8>)` in `register`
    // and was still registered, so it is freed exactly once.
    drop(unsafe { Box::from_raw(handle.cast::<u8>()) });
    Ok(ncclResult_t::Success)
}

nccl_api! {
    /// Allocates page-aligned shared host memory (device memory with the
    /// `cuda` feature when a GPU is usable).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
        to_code(mem_alloc(ptr, size))
    }

    /// Frees memory from `ncclMemAlloc`.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        to_code(mem_free(ptr))
    }

    /// Registers a buffer and returns a handle (host memory: onto huge
    /// pages where the kernel allows).
    fn ncclCommRegister / pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> ncclResult_t {
        to_code(register(comm, buff, size, handle))
    }

    /// Releases a handle from `ncclCommRegister`.
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        to_code(deregister(comm, handle))
    }
}
