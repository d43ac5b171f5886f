//! A stand-in for libibverbs in unit tests: a [`Lib`] whose entry points
//! are local functions, so registration code runs (and fails) the way it
//! would on a device, without RDMA hardware or a kernel that supports it.
//!
//! Only registration is modelled: `ibv_reg_mr` / `ibv_reg_dmabuf_mr`
//! return heap-allocated `ibv_mr`s (freed by `ibv_dereg_mr`) and record
//! their arguments; every other verb fails with `ENOSYS`. A DMA-BUF
//! registration of fd [`REJECTED_FD`] fails with `EINVAL` (a device that
//! rejects the buffer), one of a negative fd with `EBADF`.

use crate::sys::{self, Lib};
use crate::verbs::{ContextInner, PdInner};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

/// The DMA-BUF descriptor the stub device rejects with `EINVAL`.
pub(crate) const REJECTED_FD: c_int = 1_000_000;

/// One `ibv_reg_dmabuf_mr` call: `(offset, len, iova, fd, access)`.
pub(crate) type DmaBufCall = (u64, usize, u64, c_int, c_int);

thread_local! {
    static DMABUF_CALLS: RefCell<Vec<DmaBufCall>> = const { RefCell::new(Vec::new()) };
    static LIVE_MRS: RefCell<usize> = const { RefCell::new(0) };
}

/// The `ibv_reg_dmabuf_mr` calls this thread made, oldest first (drained).
pub(crate) fn take_dmabuf_calls() -> Vec<DmaBufCall> {
    DMABUF_CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

/// Registrations of this thread not yet deregistered.
pub(crate) fn live_mrs() -> usize {
    LIVE_MRS.with(|n| *n.borrow())
}

fn set_errno(e: c_int) {
    // SAFETY: the thread's errno location is always valid.
    unsafe { *libc::__errno_location() = e };
}

fn new_mr(addr: u64, len: usize, key: u32) -> *mut sys::ibv_mr {
    LIVE_MRS.with(|n| *n.borrow_mut() += 1);
    Box::into_raw(Box::new(sys::ibv_mr {
        context: std::ptr::null_mut(),
        pd: std::ptr::null_mut(),
        addr: addr as *mut c_void,
        length: len,
        handle: 0,
        lkey: key,
        rkey: key,
    }))
}

unsafe extern "C" fn reg_mr(
    _: *mut sys::ibv_pd,
    a: *mut c_void,
    n: usize,
    _: c_int,
) -> *mut sys::ibv_mr {
    new_mr(a as u64, n, 1)
}

unsafe extern "C" fn reg_dmabuf_mr(
    _: *mut sys::ibv_pd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut sys::ibv_mr {
    if fd < 0 {
        set_errno(libc::EBADF);
        return std::ptr::null_mut();
    }
    if fd == REJECTED_FD {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    DMABUF_CALLS.with(|c| c.borrow_mut().push((offset, len, iova, fd, access)));
    new_mr(iova, len, fd as u32)
}

unsafe extern "C" fn dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
    LIVE_MRS.with(|n| *n.borrow_mut() -= 1);
    // SAFETY: every MR the stub hands out comes from `Box::into_raw` in
    // `new_mr`, and is deregistered once (Mr's Drop).
    drop(unsafe { Box::from_raw(mr) });
    0
}

unsafe extern "C" fn ok_int<T>(_: *mut T) -> c_int {
    0
}

unsafe extern "C" fn get_device_list(n: *mut c_int) -> *mut *mut sys::ibv_device {
    // SAFETY: a valid out-parameter (callers' contract).
    unsafe { *n = 0 };
    set_errno(libc::ENOSYS);
    std::ptr::null_mut()
}
unsafe extern "C" fn free_device_list(_: *mut *mut sys::ibv_device) {}
unsafe extern "C" fn get_device_name(_: *mut sys::ibv_device) -> *const c_char {
    c"stub".as_ptr()
}
unsafe extern "C" fn open_device(_: *mut sys::ibv_device) -> *mut sys::ibv_context {
    set_errno(libc::ENOSYS);
    std::ptr::null_mut()
}
unsafe extern "C" fn query_device(_: *mut sys::ibv_context, _: *mut sys::ibv_device_attr) -> c_int {
    libc::ENOSYS
}
unsafe extern "C" fn query_port(
    _: *mut sys::ibv_context,
    _: u8,
    _: *mut sys::PortAttrBuf,
) -> c_int {
    libc::ENOSYS
}
unsafe extern "C" fn query_gid(
    _: *mut sys::ibv_context,
    _: u8,
    _: c_int,
    _: *mut sys::ibv_gid,
) -> c_int {
    libc::ENOSYS
}
unsafe extern "C" fn alloc_pd(_: *mut sys::ibv_context) -> *mut sys::ibv_pd {
    set_errno(libc::ENOSYS);
    std::ptr::null_mut()
}
unsafe extern "C" fn create_cq(
    _: *mut sys::ibv_context,
    _: c_int,
    _: *mut c_void,
    _: *mut sys::ibv_opaque,
    _: c_int,
) -> *mut sys::ibv_cq {
    set_errno(libc::ENOSYS);
    std::ptr::null_mut()
}
unsafe extern "C" fn create_qp(
    _: *mut sys::ibv_pd,
    _: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    set_errno(libc::ENOSYS);
    std::ptr::null_mut()
}
unsafe extern "C" fn modify_qp(_: *mut sys::ibv_qp, _: *mut sys::ibv_qp_attr, _: c_int) -> c_int {
    libc::ENOSYS
}

/// A stub library; `dmabuf` says whether it has `ibv_reg_dmabuf_mr`
/// (rdma-core 34+). Leaked: tests make a handful.
pub(crate) fn lib(dmabuf: bool) -> &'static Lib {
    Box::leak(Box::new(Lib {
        _lib: libloading::os::unix::Library::this().into(),
        get_device_list,
        free_device_list,
        get_device_name,
        open_device,
        close_device: ok_int::<sys::ibv_context>,
        query_device,
        query_port,
        query_gid,
        alloc_pd,
        dealloc_pd: ok_int::<sys::ibv_pd>,
        reg_mr,
        reg_dmabuf_mr: dmabuf.then_some(reg_dmabuf_mr as _),
        dereg_mr,
        create_cq,
        destroy_cq: ok_int::<sys::ibv_cq>,
        create_qp,
        modify_qp,
        destroy_qp: ok_int::<sys::ibv_qp>,
    }))
}

/// A protection domain of the stub library (its context and PD pointers
/// are dangling: the stub never dereferences them).
pub(crate) fn pd(dmabuf: bool) -> Arc<PdInner> {
    let ctx = ContextInner::stub(lib(dmabuf), "stub0");
    PdInner::stub(&ctx)
}
