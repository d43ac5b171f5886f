//! The background thread of a non-blocking communicator: runs its batches
//! in issue order. Started on first use, stopped by destroy/abort after
//! the queue has run (each operation has its own deadline, so it ends).

use crate::comm::{CommShared, Work};
use crate::error::{usage, FfiResult};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

struct Job {
    batch: Vec<Work>,
    calls: usize,
}

/// A communicator's worker thread, if started.
#[derive(Default)]
pub(crate) struct Worker {
    inner: Mutex<Option<(Sender<Job>, JoinHandle<()>)>>,
}

impl Worker {
    /// Queues `batch` (which stands for `calls` issued calls, already
    /// counted by `comm.begin`). On failure the calls are counted finished.
    pub(crate) fn submit(
        &self,
        comm: &Arc<CommShared>,
        batch: Vec<Work>,
        calls: usize,
    ) -> FfiResult<()> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.is_none() {
            let (tx, rx) = channel::<Job>();
            let owner = comm.clone();
            let spawned = std::thread::Builder::new()
                .name("nccl-comm".into())
                .spawn(move || {
                    for job in rx {
                        let res = owner.execute(job.batch);
                        owner.finish(job.calls, &res);
                    }
                });
            match spawned {
                Ok(join) => *inner = Some((tx, join)),
                Err(e) => {
                    let err = nccl_rs::Error::System {
                        rank: 0,
                        what: "starting a communicator worker thread".into(),
                        source: e,
                    };
                    comm.finish(calls, &Err(usage(err.to_string())));
                    return Err(err);
                }
            }
        }
        let (tx, _) = inner.as_ref().expect("started above");
        if tx.send(Job { batch, calls }).is_err() {
            comm.finish(
                calls,
                &Err(usage("the communicator's worker thread has stopped")),
            );
            return Err(usage("the communicator's worker thread has stopped"));
        }
        Ok(())
    }

    /// Lets the queue run out, then joins the thread.
    pub(crate) fn stop(&self) {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((tx, join)) = taken {
            drop(tx);
            if join.thread().id() != std::thread::current().id() {
                let _ = join.join();
            }
        }
    }
}
