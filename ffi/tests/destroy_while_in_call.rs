//! `ncclCommDestroy` while another thread is blocked in a collective on the
//! same communicator: NCCL allows one thread at a time on a communicator,
//! so the call is refused at once with `ncclInvalidUsage` (it used to wait
//! for `NCCL_RS_TIMEOUT`, 1800 s by default); `ncclCommAbort` then stops the
//! blocked collective, which returns an error promptly.

use nccl::coll::ncclAllReduce;
use nccl::error::ncclGetLastError;
use nccl::init::ncclCommInitAll;
use nccl::manage::{ncclCommAbort, ncclCommDestroy};
use nccl::{ncclComm_t, ncclResult_t};
use std::ffi::{c_void, CStr};
use std::time::{Duration, Instant};

const FLOAT32: i32 = 7;
const SUM: i32 = 0;

/// A communicator handle that may cross threads (the test hands it over).
#[derive(Clone, Copy)]
struct Comm(ncclComm_t);
// SAFETY: an ncclComm_t is an opaque handle the library looks up in its own
// table; it may be used from any thread.
unsafe impl Send for Comm {}

#[test]
fn destroy_under_a_blocked_collective_is_refused_and_abort_unblocks_it() {
    // Bounds a regression (a destroy that waits for the collective) to a
    // failure after 20 s instead of a hang. The only test of this binary.
    std::env::set_var("NCCL_RS_TIMEOUT", "20");
    let mut comms: [ncclComm_t; 2] = [std::ptr::null_mut(); 2];
    // SAFETY: `comms` has room for the 2 handles; a NULL devlist is allowed.
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) };
    assert_eq!(rc, ncclResult_t::Success);
    let c0 = Comm(comms[0]);
    // Only rank 0 calls the all-reduce, so it blocks waiting for rank 1.
    let blocked = std::thread::spawn(move || {
        let c0 = c0;
        let send = vec![1.0f32; 1024];
        let mut recv = vec![0.0f32; 1024];
        let start = Instant::now();
        // SAFETY: both buffers hold 1024 floats and outlive the call; no
        // stream (host buffers).
        let rc = unsafe {
            ncclAllReduce(
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                1024,
                FLOAT32,
                SUM,
                c0.0,
                std::ptr::null_mut(),
            )
        };
        (rc, start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    // SAFETY: a live handle.
    let rc = unsafe { ncclCommDestroy(c0.0) };
    let took = start.elapsed();
    assert_eq!(rc, ncclResult_t::InvalidUsage);
    assert!(took < Duration::from_secs(2), "destroy took {took:?}");
    // SAFETY: the library returns a NUL-terminated string it keeps alive.
    let why = unsafe { CStr::from_ptr(ncclGetLastError(c0.0)) }
        .to_string_lossy()
        .into_owned();
    assert!(why.contains("another thread"), "{why}");
    assert!(why.contains("ncclCommAbort"), "{why}");
    // SAFETY: a live handle (the refused destroy left it so).
    assert_eq!(unsafe { ncclCommAbort(c0.0) }, ncclResult_t::Success);
    let (rc, took) = blocked.join().expect("the blocked thread");
    assert_ne!(rc, ncclResult_t::Success);
    assert!(
        took < Duration::from_secs(10),
        "the all-reduce ended after {took:?}"
    );
    // SAFETY: a live handle.
    assert_eq!(unsafe { ncclCommDestroy(comms[1]) }, ncclResult_t::Success);
}
