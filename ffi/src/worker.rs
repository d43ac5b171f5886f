//! A communicator's proxy thread: runs its batches in issue order.
//!
//! Non-blocking communicators always use it. A blocking communicator
//! switches to it for good with its first call on device memory when
//! calls may return at once (`gate.rs`); from then on every call of it
//! runs here, in order. Calls on device memory are gated on their streams
//! when queued and the caller does not wait for them; for any other call
//! of a blocking communicator the caller waits ([`Done`]), which keeps
//! host-memory calls blocking.
//!
//! Started on first use, stopped by destroy/abort after the queue has run
//! (each operation has its own deadline, so it ends); gates left are then
//! released.

use crate::error::{usage, FfiResult};
use crate::gate::{self, Flag, Item, Proxied};
use crate::work::Work;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

struct Job {
    items: Vec<Item>,
    calls: usize,
    done: Arc<Done>,
}

/// The result of a queued batch, for a caller that waits for it.
#[derive(Default)]
pub(crate) struct Done {
    res: Mutex<Option<FfiResult<()>>>,
    cv: Condvar,
}

impl Done {
    fn set(&self, r: FfiResult<()>) {
        *self.res.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        self.cv.notify_all();
    }

    /// Waits until the batch ran (each of its operations has a deadline)
    /// and takes its result.
    pub(crate) fn wait(&self) -> FfiResult<()> {
        let mut g = self.res.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// What [`Worker::submit`] queued.
pub(crate) struct Submitted {
    /// Every call of the batch is gated: the caller need not wait.
    pub(crate) all_gated: bool,
    /// Set when the batch ran.
    pub(crate) done: Arc<Done>,
}

#[derive(Default)]
struct Inner {
    thread: Option<(Sender<Job>, JoinHandle<()>)>,
    /// Blocking communicator: every call goes through the proxy now.
    proxied: bool,
    flag: Flag,
}

/// A communicator's proxy thread, if started.
#[derive(Default)]
pub(crate) struct Worker {
    inner: Mutex<Inner>,
}

impl Worker {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `batch` of the blocking communicator `comm` goes through
    /// the proxy: once it did, always; first when it holds a call on
    /// device memory and such calls may return at once.
    pub(crate) fn wants(&self, comm: &dyn Proxied, batch: &[Work]) -> bool {
        if self.lock().proxied {
            return true;
        }
        if gate::async_for(comm, batch) {
            self.lock().proxied = true;
            return true;
        }
        false
    }

    /// Queues `batch` (which stands for `calls` issued calls, already
    /// counted by `comm.begin`), gating its calls on device memory. On
    /// failure the calls are counted finished.
    pub(crate) fn submit<C: Proxied>(
        &self,
        comm: &Arc<C>,
        batch: Vec<Work>,
        calls: usize,
    ) -> FfiResult<Submitted> {
        // One lock: gates get their sequence numbers in queue order.
        let mut inner = self.lock();
        if inner.thread.is_none() {
            let (tx, rx) = channel::<Job>();
            let owner = comm.clone();
            let spawned = std::thread::Builder::new()
                .name("nccl-proxy".into())
                .spawn(move || {
                    let mut px = gate::ProxyState::default();
                    for job in rx {
                        let res = catch_unwind(AssertUnwindSafe(|| {
                            owner.execute_items(job.items, &mut px)
                        }))
                        .unwrap_or_else(|_| {
                            Err(nccl_rs::Error::Internal {
                                rank: owner.ident_if_known().map_or(0, |i| i.0),
                                msg: "panic while running an operation".into(),
                            })
                        });
                        owner.finish(job.calls, &res);
                        job.done.set(res);
                    }
                });
            match spawned {
                Ok(join) => inner.thread = Some((tx, join)),
                Err(e) => {
                    let err = nccl_rs::Error::System {
                        rank: 0,
                        what: "starting a communicator proxy thread".into(),
                        source: e,
                    };
                    comm.finish(calls, &Err(usage(err.to_string())));
                    return Err(err);
                }
            }
        }
        let items: Vec<Item> = batch
            .into_iter()
            .map(|work| {
                let gate = inner.flag.gate(&**comm, &work);
                Item { work, gate }
            })
            .collect();
        let all_gated = items
            .iter()
            .all(|i| i.gate.as_ref().is_some_and(|g| g.complete()));
        let done = Arc::new(Done::default());
        let job = Job {
            items,
            calls,
            done: done.clone(),
        };
        let (tx, _) = inner.thread.as_ref().expect("started above");
        if tx.send(job).is_err() {
            // The job (and its gates) came back in the error and is
            // dropped here: the gates are released.
            comm.finish(
                calls,
                &Err(usage("the communicator's proxy thread has stopped")),
            );
            return Err(usage("the communicator's proxy thread has stopped"));
        }
        Ok(Submitted { all_gated, done })
    }

    /// Lets the queue run out, joins the thread, and releases any gate
    /// still waiting.
    pub(crate) fn stop(&self) {
        let taken = self.lock().thread.take();
        if let Some((tx, join)) = taken {
            drop(tx);
            if join.thread().id() != std::thread::current().id() {
                let _ = join.join();
            }
        }
        self.lock().flag.release_all();
    }
}
