//! Socket helper threads (NCCL's `NCCL_SOCKET_NTHREADS`).
//!
//! A helper owns some lanes of one comm (their sockets) and moves their
//! chunks while the caller's thread is elsewhere. The comm hands chunks
//! over through a per-lane queue under a mutex and learns of completions
//! through a per-lane counter, so `test` never waits for a helper: it takes
//! a lock that is only ever held for a queue push or pop.
//!
//! An idle helper sleeps in `poll` on the sockets it has work for and an
//! `eventfd` the comm signals when it queues a chunk on an empty lane or
//! stops the helper.
//! On an error the helper records it and exits; the comm reports it.
//! Dropping the comm stops and joins its helpers before the caller's
//! buffers can go away.

use crate::comm::Fault;
use crate::lanes::{chunk_io, Chunk, Dir};
use crate::sys;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Longest sleep of an idle helper between looks at its stop flag (a stop
/// also signals the eventfd, so this is only a safety net).
const IDLE_POLL_MS: libc::c_int = 1000;
/// Stack of a helper thread: it only loops over its lanes.
const HELPER_STACK_BYTES: usize = 256 << 10;

/// What a comm and a helper share about one lane.
#[derive(Default)]
pub(crate) struct LaneShared {
    queue: Mutex<VecDeque<Chunk>>,
    /// Chunks of this lane finished so far.
    pub(crate) done: AtomicU64,
}

impl LaneShared {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Chunk>> {
        // Nothing panics while holding the lock; a poisoned queue is intact.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `c`; returns whether the queue was empty (the helper may be
    /// asleep).
    pub(crate) fn push(&self, c: Chunk) -> bool {
        let mut q = self.lock();
        q.push_back(c);
        q.len() == 1
    }
}

/// What a comm and a helper share about the helper.
struct HelperShared {
    wake: OwnedFd,
    stop: AtomicBool,
    failed: AtomicBool,
    fault: Mutex<Option<Fault>>,
}

/// A running helper thread.
pub(crate) struct Helper {
    shared: Arc<HelperShared>,
    thread: Option<JoinHandle<()>>,
}

impl Helper {
    /// Starts a helper for `lanes` (socket and shared state of each).
    pub(crate) fn spawn(dir: Dir, lanes: Vec<(OwnedFd, Arc<LaneShared>)>) -> io::Result<Helper> {
        let shared = Arc::new(HelperShared {
            wake: sys::eventfd()?,
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            fault: Mutex::new(None),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("nccl-tcp-helper".into())
            .stack_size(HELPER_STACK_BYTES)
            .spawn(move || run(dir, &s, &lanes))?;
        Ok(Helper {
            shared,
            thread: Some(thread),
        })
    }

    /// Wakes the helper if it sleeps.
    pub(crate) fn wake(&self) {
        sys::eventfd_signal(&self.shared.wake);
    }

    /// The error that stopped the helper, if any.
    pub(crate) fn fault(&self) -> Option<Fault> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        self.shared
            .fault
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.wake();
        if let Some(t) = self.thread.take() {
            // The helper never blocks longer than one short poll once woken.
            let _ = t.join();
        }
    }
}

fn run(dir: Dir, shared: &HelperShared, lanes: &[(OwnedFd, Arc<LaneShared>)]) {
    let mut cur: Vec<Option<Chunk>> = vec![None; lanes.len()];
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(lanes.len() + 1);
    let events = match dir {
        Dir::Send => libc::POLLOUT,
        Dir::Recv => libc::POLLIN,
    };
    while !shared.stop.load(Ordering::Acquire) {
        let mut moved = false;
        for (k, (fd, lane)) in lanes.iter().enumerate() {
            loop {
                if cur[k].is_none() {
                    cur[k] = lane.lock().pop_front();
                }
                let Some(c) = cur[k].as_mut() else { break };
                match chunk_io(dir, fd, c, None) {
                    Ok(m) => moved |= m,
                    Err(f) => return fail(shared, f),
                }
                if !c.done() {
                    break;
                }
                cur[k] = None;
                lane.done.fetch_add(1, Ordering::Release);
            }
        }
        if moved {
            continue;
        }
        fds.clear();
        fds.push(libc::pollfd {
            fd: shared.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for (k, (fd, _)) in lanes.iter().enumerate() {
            if cur[k].is_some() {
                fds.push(libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events,
                    revents: 0,
                });
            }
        }
        if let Err(e) = sys::poll(&mut fds, IDLE_POLL_MS) {
            return fail(shared, Fault::from_io("poll", &e));
        }
        if fds[0].revents != 0 {
            sys::eventfd_drain(&shared.wake);
        }
    }
}

fn fail(shared: &HelperShared, f: Fault) {
    if let Fault::Io { .. } | Fault::Closed = f {
        tracing::warn!(fault = ?f, "NET/Socket: helper thread stopped");
    }
    *shared.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    shared.failed.store(true, Ordering::Release);
}
