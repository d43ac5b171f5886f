//! Non-blocking collectives: the Rust analogue of `torch.distributed`'s
//! `async_op=True`.
//!
//! An async operation takes ownership of its buffer (a `Vec<T>`, a
//! `Box<[T]>`, anything `AsMut<[T]> + Send + 'static`) and hands it back from
//! [`AsyncOp::wait`], so the types — not documentation — keep the buffer
//! alive and untouched while the operation runs. Operations run in issue
//! order on one worker thread per communicator, through the same engine,
//! schedules and deadlines as the blocking calls; a blocking call issued
//! after async ones waits for them first. Dropping an [`AsyncOp`] without
//! waiting blocks until it finished: nothing leaks and nothing runs on a
//! freed buffer.

use super::core::Core;
use super::raw::{RawArgs, RawP2p};
use super::Communicator;
use crate::datatype::{Element, RedOp};
use crate::engine::{CallBufs, Region};
use crate::error::{Error, Result};
use crate::plan::Coll;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce(&mut Core) + Send>;

/// The per-communicator worker and its queue (started on first use).
pub(crate) struct AsyncQueue {
    core: Arc<Mutex<Core>>,
    tx: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    pending: Arc<(Mutex<usize>, Condvar)>,
}

impl AsyncQueue {
    pub(crate) fn new(core: Arc<Mutex<Core>>) -> AsyncQueue {
        AsyncQueue {
            core,
            tx: None,
            worker: None,
            pending: Arc::default(),
        }
    }

    fn push(&mut self, job: Job) -> Result<()> {
        if self.tx.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let (core, pending) = (self.core.clone(), self.pending.clone());
            let worker = std::thread::Builder::new()
                .name("nccl-async".into())
                .spawn(move || {
                    for job in rx {
                        job(&mut core.lock().unwrap_or_else(|p| p.into_inner()));
                        let (count, cv) = &*pending;
                        *count.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
                        cv.notify_all();
                    }
                })
                .map_err(|e| Error::System {
                    rank: 0,
                    what: "starting the async worker".into(),
                    source: e,
                })?;
            self.tx = Some(tx);
            self.worker = Some(worker);
        }
        *self.pending.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        if self.tx.as_ref().expect("started above").send(job).is_err() {
            *self.pending.0.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
            return Err(Error::InvalidUsage("the async worker has stopped".into()));
        }
        Ok(())
    }

    /// Waits until every queued operation has run (each has its own
    /// deadline, so this ends).
    pub(crate) fn drain(&self) {
        if self.tx.is_none() {
            return; // no async operation was ever issued
        }
        let (count, cv) = &*self.pending;
        let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            n = cv.wait(n).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for AsyncQueue {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

struct Slot<B> {
    result: Mutex<Option<Result<B>>>,
    done: Condvar,
}

/// A collective in flight. [`wait`](AsyncOp::wait) returns the buffer with
/// the result in it.
#[must_use = "an AsyncOp does nothing useful unless waited for"]
pub struct AsyncOp<B> {
    slot: Arc<Slot<B>>,
    taken: bool,
}

impl<B> AsyncOp<B> {
    /// Whether the operation has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.slot
            .result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Waits for the operation and returns the buffer.
    pub fn wait(mut self) -> Result<B> {
        self.take(None).expect("no deadline given")
    }

    /// Waits at most `timeout`; gives the handle back if it has not finished.
    pub fn wait_timeout(mut self, timeout: Duration) -> std::result::Result<Result<B>, AsyncOp<B>> {
        match self.take(Some(Instant::now() + timeout)) {
            Some(r) => Ok(r),
            None => Err(self),
        }
    }

    fn take(&mut self, deadline: Option<Instant>) -> Option<Result<B>> {
        let mut r = self.slot.result.lock().unwrap_or_else(|p| p.into_inner());
        while r.is_none() {
            match deadline {
                None => r = self.slot.done.wait(r).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    r = self
                        .slot
                        .done
                        .wait_timeout(r, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
        self.taken = true;
        r.take()
    }
}

impl<B> Drop for AsyncOp<B> {
    fn drop(&mut self) {
        if !self.taken {
            drop(self.take(None));
        }
    }
}

impl Communicator {
    fn submit<T, B>(
        &mut self,
        mut buf: B,
        run: impl FnOnce(&mut Core, Region) -> Result<()> + Send + 'static,
    ) -> Result<AsyncOp<B>>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        let slot = Arc::new(Slot {
            result: Mutex::new(None),
            done: Condvar::new(),
        });
        let theirs = slot.clone();
        self.queue.push(Box::new(move |core: &mut Core| {
            let s = buf.as_mut();
            let region = Region::new(s.as_mut_ptr().cast(), std::mem::size_of_val(s));
            let res = run(core, region).map(|()| buf);
            *theirs.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(res);
            theirs.done.notify_all();
        }))?;
        Ok(AsyncOp { slot, taken: false })
    }

    /// In-place all-reduce that runs in the background; `wait` returns `buf`.
    pub fn all_reduce_async<T, B>(&mut self, buf: B, op: RedOp) -> Result<AsyncOp<B>>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        self.submit::<T, B>(buf, move |core, r| {
            let count = r.len / T::DTYPE.size();
            core.collective(
                Coll::AllReduce { count },
                T::DTYPE,
                op,
                CallBufs {
                    input: r,
                    output: r,
                    group: vec![],
                },
            )
        })
    }

    /// In-place broadcast from `root` in the background.
    pub fn broadcast_async<T, B>(&mut self, buf: B, root: usize) -> Result<AsyncOp<B>>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        if root >= self.nranks {
            return Err(Error::invalid(format!(
                "broadcast: root {root} is not a rank of {}",
                self.nranks
            )));
        }
        self.submit::<T, B>(buf, move |core, r| {
            let count = r.len / T::DTYPE.size();
            let coll = Coll::Broadcast { count, root };
            core.collective(
                coll,
                T::DTYPE,
                RedOp::Sum,
                CallBufs {
                    input: r,
                    output: r,
                    group: vec![],
                },
            )
        })
    }

    /// In-place all-gather in the background: this rank's part is
    /// `buf[rank*c..(rank+1)*c]` on entry.
    pub fn all_gather_async<T, B>(&mut self, buf: B) -> Result<AsyncOp<B>>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        let (rank, n) = (self.rank, self.nranks);
        self.submit::<T, B>(buf, move |core, r| {
            let c = equal_part(r.len / T::DTYPE.size(), n)?;
            let bytes = c * T::DTYPE.size();
            let input = Region::new(r.ptr.wrapping_add(rank * bytes), bytes);
            core.collective(
                Coll::AllGather { send_count: c },
                T::DTYPE,
                RedOp::Sum,
                CallBufs {
                    input,
                    output: r,
                    group: vec![],
                },
            )
        })
    }

    /// In-place reduce-scatter in the background: the result lands in
    /// `buf[rank*c..(rank+1)*c]`.
    pub fn reduce_scatter_async<T, B>(&mut self, buf: B, op: RedOp) -> Result<AsyncOp<B>>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        let (rank, n) = (self.rank, self.nranks);
        self.submit::<T, B>(buf, move |core, r| {
            let c = equal_part(r.len / T::DTYPE.size(), n)?;
            let bytes = c * T::DTYPE.size();
            let output = Region::new(r.ptr.wrapping_add(rank * bytes), bytes);
            core.collective(
                Coll::ReduceScatter { recv_count: c },
                T::DTYPE,
                op,
                CallBufs {
                    input: r,
                    output,
                    group: vec![],
                },
            )
        })
    }
}

/// A call's regions, moved to the async worker. The caller of the
/// `unsafe` raw async functions promised the memory stays valid until the
/// operation finished; nothing else touches the pointers.
struct SendBufs(CallBufs);

// SAFETY: the regions are plain addresses; the raw async functions' safety
// contract keeps the memory valid and unaliased until the worker is done.
unsafe impl Send for SendBufs {}

impl Communicator {
    /// Queues `run` behind earlier async operations; `keep` comes back from
    /// `wait` with the result, on failure too.
    fn submit_keep<K: Send + 'static>(
        &mut self,
        keep: K,
        run: impl FnOnce(&mut Core) -> Result<()> + Send + 'static,
    ) -> Result<AsyncOp<(K, Result<()>)>> {
        let slot = Arc::new(Slot {
            result: Mutex::new(None),
            done: Condvar::new(),
        });
        let theirs = slot.clone();
        self.queue.push(Box::new(move |core: &mut Core| {
            let res = run(core);
            *theirs.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ok((keep, res)));
            theirs.done.notify_all();
        }))?;
        Ok(AsyncOp { slot, taken: false })
    }

    /// [`Communicator::collective_raw`] in the background, after the async
    /// operations issued before it. Arguments are checked now (an error
    /// here means nothing was queued); the call's own result comes from
    /// `wait` together with `keep`, which the operation holds until it ends
    /// (for a binding: whatever owns the buffers), so `keep` is always
    /// dropped by the thread that waits.
    ///
    /// # Safety
    /// As [`Communicator::collective_raw`], for as long as the operation
    /// runs: until `wait` returned or the [`AsyncOp`] was dropped.
    pub unsafe fn collective_raw_async<K: Send + 'static>(
        &mut self,
        a: &RawArgs,
        keep: K,
    ) -> Result<AsyncOp<(K, Result<()>)>> {
        let (coll, bufs) = self.raw_call(a)?;
        let (dtype, op, bufs) = (a.dtype, a.op, SendBufs(bufs));
        self.submit_keep(keep, move |core| {
            let bufs = bufs;
            core.collective(coll, dtype, op, bufs.0)
        })
    }

    /// [`Communicator::run_group_raw`] in the background, as
    /// [`Communicator::collective_raw_async`].
    ///
    /// # Safety
    /// As [`Communicator::run_group_raw`], for as long as the operation
    /// runs: until `wait` returned or the [`AsyncOp`] was dropped.
    pub unsafe fn run_group_raw_async<K: Send + 'static>(
        &mut self,
        ops: &[RawP2p],
        keep: K,
    ) -> Result<AsyncOp<(K, Result<()>)>> {
        let (sched, what, bufs, (ops, dtypes)) = self.group_call(super::raw::raw_group(ops)?)?;
        let bufs = SendBufs(bufs);
        self.submit_keep(keep, move |core| {
            let bufs = bufs;
            core.group(&sched, what, bufs.0, (&ops, &dtypes))
        })
    }
}

fn equal_part(len: usize, n: usize) -> Result<usize> {
    if len % n != 0 {
        return Err(Error::invalid(format!(
            "{len} elements do not split into {n} equal parts"
        )));
    }
    Ok(len / n)
}
