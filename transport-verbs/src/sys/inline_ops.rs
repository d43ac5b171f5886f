//! The `static inline` data-path calls of `verbs.h` (`ibv_poll_cq`,
//! `ibv_post_send`, `ibv_post_recv`), made through the provider's
//! `context->ops` table.

use super::types::{ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_wc};
use std::ffi::c_int;

/// `ibv_poll_cq`: calls the provider's `poll_cq` through `cq->context->ops`.
///
/// # Safety
/// `cq` must be a live CQ from `ibv_create_cq`, and `wc` must point to
/// `n` writable `ibv_wc`s.
pub(crate) unsafe fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ points to its live context, whose ops table the
    // provider filled in at open time (the caller guarantees liveness).
    let f = unsafe { (*(*cq).context).ops.poll_cq };
    match f {
        // SAFETY: the provider's own poll_cq with the caller's valid args.
        Some(f) => unsafe { f(cq, n, wc) },
        None => -libc::ENOSYS,
    }
}

/// `ibv_post_send` through `qp->context->ops.post_send`.
///
/// # Safety
/// `qp` must be a live QP; `wr` a valid chain whose scatter lists name
/// registered memory that stays valid until the work completes.
pub(crate) unsafe fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: see `poll_cq`.
    let f = unsafe { (*(*qp).context).ops.post_send };
    match f {
        // SAFETY: the caller guarantees the work requests are valid.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::ENOSYS,
    }
}

/// `ibv_post_recv` through `qp->context->ops.post_recv`.
///
/// # Safety
/// As [`post_send`].
pub(crate) unsafe fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: see `poll_cq`.
    let f = unsafe { (*(*qp).context).ops.post_recv };
    match f {
        // SAFETY: the caller guarantees the work requests are valid.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::ENOSYS,
    }
}
