//! `ncclGroupStart` / `ncclGroupEnd`, and the one path every call takes to
//! run: `issue`.
//!
//! Groups are per thread and nest; only the outermost `ncclGroupEnd` runs
//! the queued calls. At that point the calls are sorted by communicator
//! (first appearance order). Each communicator's batch is its inits,
//! splits and collectives in issue order, then all its sends and receives
//! as one group (so rings and all-to-all exchanges cannot deadlock, and
//! the order is the same on every rank whatever the interleaving). The
//! batches of blocking communicators run concurrently, one scoped thread
//! each, and `ncclGroupEnd` waits for them; those of non-blocking
//! communicators go to their proxy threads (`worker.rs`) and
//! `ncclGroupEnd` returns `ncclInProgress`. A blocking communicator that
//! switched to its proxy thread (calls on device memory that return at
//! once, `gate.rs`) queues its batch there too; `ncclGroupEnd` waits for
//! it unless every call in it is gated on its stream.

use crate::comm::CommShared;
use crate::error::{report, to_code, usage, Failure, FfiResult};
use crate::panic::nccl_api;
use crate::types::ncclResult_t;
use crate::work::{P2pWork, Work};
use nccl_rs::Error;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

#[derive(Default)]
struct Group {
    depth: usize,
    calls: Vec<(Arc<CommShared>, Work)>,
    error: Option<Failure>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::default();
}

/// Remembers a failed call inside a group: the group's end reports it
/// and runs nothing (as NCCL does).
pub(crate) fn note_error(code: ncclResult_t) -> ncclResult_t {
    if code != ncclResult_t::Success && code != ncclResult_t::InProgress {
        GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth > 0 && g.error.is_none() {
                let msg = crate::error::last_error_text();
                g.error = Some(Failure { code, msg });
            }
        });
    }
    code
}

/// The code of a call that may be inside a group: a failure is also
/// remembered for the group's end.
pub(crate) fn code(r: FfiResult<ncclResult_t>) -> ncclResult_t {
    note_error(to_code(r))
}

/// Whether this thread's open group holds calls on `comm` (waiting for
/// them here would wait forever).
pub(crate) fn holds(comm: &Arc<CommShared>) -> bool {
    GROUP.with(|g| g.borrow().calls.iter().any(|(c, _)| Arc::ptr_eq(c, comm)))
}

/// Issues one call on `comm`: queued inside a group; otherwise run now
/// (blocking) or handed to the worker (non-blocking: `ncclInProgress`).
pub(crate) fn issue(comm: &Arc<CommShared>, work: Work) -> FfiResult<ncclResult_t> {
    comm.check_open()?;
    comm.begin(1);
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Some(work);
        }
        g.calls.push((comm.clone(), work));
        None
    });
    match queued {
        None => Ok(ncclResult_t::Success),
        Some(work) => run_batches(vec![(comm.clone(), vec![work], 1)]),
    }
}

/// Runs `batch` on `comm` here, catching panics, and counts its calls
/// finished.
fn run_here(comm: &CommShared, batch: Vec<Work>, calls: usize) -> FfiResult<()> {
    let res = catch_unwind(AssertUnwindSafe(|| comm.execute(batch))).unwrap_or_else(|_| {
        Err(Error::Internal {
            rank: comm.ident_if_known().map_or(0, |i| i.0),
            msg: "panic while running an operation".into(),
        })
    });
    comm.finish(calls, &res);
    res
}

type Batch = (Arc<CommShared>, Vec<Work>, usize);

fn run_batches(list: Vec<Batch>) -> FfiResult<ncclResult_t> {
    // Held until this thread's blocking calls return: ncclCommDestroy from
    // another thread meanwhile is refused rather than left to wait.
    let comms: Vec<Arc<CommShared>> = list
        .iter()
        .filter(|(c, _, _)| c.blocking())
        .map(|(c, _, _)| c.clone())
        .collect();
    let _in_calls: Vec<_> = comms.iter().map(|c| c.enter_call()).collect();
    let mut first: Option<Error> = None;
    let mut in_progress = false;
    let mut blocking = Vec::new();
    let mut waits = Vec::new();
    for (comm, batch, calls) in list {
        let proxied = !comm.blocking() || comm.worker.wants(&*comm, &batch);
        if !proxied {
            blocking.push((comm, batch, calls));
            continue;
        }
        match comm.worker.submit(&comm, batch, calls) {
            Ok(_) if !comm.blocking() => in_progress = true,
            Ok(sub) if !sub.all_gated => waits.push(sub.done),
            Ok(_) => {}
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    let mut results: Vec<FfiResult<()>> = if blocking.is_empty() {
        Vec::new()
    } else if blocking.len() == 1 {
        let (comm, batch, calls) = blocking.pop().expect("one batch");
        vec![run_here(&comm, batch, calls)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = blocking
                .into_iter()
                .map(|(comm, batch, calls)| {
                    let spawned = std::thread::Builder::new()
                        .name("nccl-group".into())
                        .spawn_scoped(s, move || run_here(&comm, batch, calls));
                    spawned.map_err(|e| Error::System {
                        rank: 0,
                        what: "starting a group thread".into(),
                        source: e,
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.and_then(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(usage("a group thread panicked")))
                    })
                })
                .collect()
        })
    };
    // Proxied blocking communicators: wait for batches that hold anything
    // but gated calls on device memory (those return at once).
    results.extend(waits.iter().map(|d| d.wait()));
    for r in results {
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    }
    match first {
        Some(e) => Err(e),
        None if in_progress => Ok(ncclResult_t::InProgress),
        None => Ok(ncclResult_t::Success),
    }
}

/// Sorts queued calls into one batch per communicator: inits, splits and
/// collectives in order, then one merged send/recv group.
fn batches(calls: Vec<(Arc<CommShared>, Work)>) -> Vec<Batch> {
    let mut out: Vec<(Batch, Vec<P2pWork>)> = Vec::new();
    for (comm, work) in calls {
        let i = match out.iter().position(|((c, _, _), _)| Arc::ptr_eq(c, &comm)) {
            Some(i) => i,
            None => {
                out.push(((comm, Vec::new(), 0), Vec::new()));
                out.len() - 1
            }
        };
        let ((_, batch, n), p2p) = &mut out[i];
        *n += 1;
        match work {
            Work::P2p(ops) => p2p.extend(ops),
            other => batch.push(other),
        }
    }
    out.into_iter()
        .map(|((comm, mut batch, n), p2p)| {
            if !p2p.is_empty() {
                batch.push(Work::P2p(p2p));
            }
            (comm, batch, n)
        })
        .collect()
}

/// Drops queued calls of a failed group, settling what they promised.
fn abandon(calls: Vec<(Arc<CommShared>, Work)>, why: &Failure) {
    for (comm, work) in calls {
        let err = || {
            usage(format!(
                "not run: an earlier call in the group failed: {}",
                why.msg
            ))
        };
        match work {
            Work::Split { child: Some(c), .. } => c.finish(1, &Err(err())),
            Work::Init(_) => {
                comm.finish(1, &Err(err()));
                continue;
            }
            _ => {}
        }
        comm.finish(1, &Ok(()));
    }
}

fn group_end() -> FfiResult<ncclResult_t> {
    let taken = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(usage("ncclGroupEnd without a matching ncclGroupStart"));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some((std::mem::take(&mut g.calls), g.error.take())))
    })?;
    match taken {
        None => Ok(ncclResult_t::Success),
        Some((calls, Some(failure))) => {
            abandon(calls, &failure);
            Ok(report(&failure))
        }
        Some((calls, None)) => run_batches(batches(calls)),
    }
}

nccl_api! {
    /// Starts (or nests) a group on this thread.
    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        ncclResult_t::Success
    }

    /// Ends a group; the outermost end runs the queued calls.
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        to_code(group_end())
    }
}
