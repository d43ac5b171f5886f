//! Which rank a log line names when its event carries no `rank` field.
//!
//! In order: the rank of the operation this thread is running
//! ([`OpRank`]), the rank of the first communicator this thread created,
//! the process's rank (the first communicator created in the process,
//! unless other threads created communicators of other ranks: then ranks
//! are threads and no single rank speaks for the process), the launcher's
//! `RANK`-style variable, and else none (`-`).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// No rank known.
const UNSET: usize = usize::MAX;

/// The process's rank as log lines use it; `UNSET` when unknown or when
/// several threads hold communicators of different ranks.
static PROCESS: AtomicUsize = AtomicUsize::new(UNSET);

/// What registered the process's rank: `(rank, thread id)` of the first
/// registration, or `None` once threads disagreed.
static FIRST: Mutex<Option<Option<(usize, u32)>>> = Mutex::new(None);

/// The launcher's rank (`RANK`, `OMPI_COMM_WORLD_RANK`, ...), read once when
/// logging starts.
static LAUNCHER: AtomicUsize = AtomicUsize::new(UNSET);

thread_local! {
    /// The rank of the first communicator this thread created.
    static THREAD: Cell<usize> = const { Cell::new(UNSET) };
    /// The rank of the operation this thread is running, if any.
    static OP: Cell<usize> = const { Cell::new(UNSET) };
}

fn known(r: usize) -> Option<usize> {
    (r != UNSET).then_some(r)
}

/// Records that this thread created a communicator as `rank`.
pub(super) fn register(rank: usize) {
    let tid = super::line::tid();
    let _ = THREAD.try_with(|t| {
        if t.get() == UNSET {
            t.set(rank);
        }
    });
    let mut first = FIRST.lock().unwrap_or_else(|p| p.into_inner());
    match *first {
        None => {
            *first = Some(Some((rank, tid)));
            PROCESS.store(rank, Ordering::Relaxed);
        }
        // Another thread, another rank: ranks are threads of this process.
        // (The same thread creating another rank is a split: the first
        // communicator still names the process.)
        Some(Some((r, t))) if r != rank && t != tid => {
            *first = Some(None);
            PROCESS.store(UNSET, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// Remembers the launcher's rank.
pub(super) fn set_launcher(rank: Option<usize>) {
    LAUNCHER.store(rank.unwrap_or(UNSET), Ordering::Relaxed);
}

/// The rank of a line whose event and spans name none.
pub(super) fn current() -> Option<usize> {
    let op = OP.try_with(Cell::get).unwrap_or(UNSET);
    let thread = THREAD.try_with(Cell::get).unwrap_or(UNSET);
    known(op)
        .or(known(thread))
        .or(known(PROCESS.load(Ordering::Relaxed)))
        .or(known(LAUNCHER.load(Ordering::Relaxed)))
}

/// While alive, this thread's log lines name `rank` (the communicator whose
/// operation it runs); dropping it restores the previous one. Operations
/// of different communicators nest (a split runs collectives on its parent).
#[must_use = "the rank applies while the guard lives"]
pub(crate) struct OpRank {
    prev: usize,
}

impl OpRank {
    /// Names `rank` on this thread's lines until the guard drops.
    pub(crate) fn enter(rank: usize) -> OpRank {
        let prev = OP.try_with(|c| c.replace(rank)).unwrap_or(UNSET);
        OpRank { prev }
    }
}

impl Drop for OpRank {
    fn drop(&mut self) {
        let _ = OP.try_with(|c| c.set(self.prev));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_rank_nests_and_restores() {
        let before = current();
        {
            let _a = OpRank::enter(5);
            assert_eq!(current(), Some(5));
            {
                let _b = OpRank::enter(2);
                assert_eq!(current(), Some(2));
            }
            assert_eq!(current(), Some(5));
        }
        assert_eq!(current(), before);
    }

    #[test]
    fn a_thread_keeps_its_first_communicators_rank() {
        let seen = std::thread::spawn(|| {
            register(7);
            register(3);
            let first = current();
            let _op = OpRank::enter(3);
            (first, current())
        })
        .join()
        .unwrap();
        assert_eq!(seen, (Some(7), Some(3)));
    }
}
